"""``spe export``: parsing and printing only; the work is :func:`spe.lab.export.export_run`."""

from __future__ import annotations

import argparse

__all__ = ["add_export_parser", "cmd_export"]


def cmd_export(args: argparse.Namespace) -> int:
    from spe.lab.export import export_run

    info = export_run(args.run, args.out, overwrite=args.overwrite)
    suppressed = (f"; its generation config suppresses {len(info['suppressed'])} ids MidiTok's REMI lacks"
                  if info["suppressed"] else "")
    print(f"wrote {info['out']}: {', '.join(info['files'])} ({info['architecture']}, step {info['step']}){suppressed}")
    return 0


def add_export_parser(sub) -> None:
    from spe.lab.cli.names import add_run_flag

    p = sub.add_parser("export", help="a run's model as a Hugging Face transformers folder, with its MidiTok "
                       "tokenizer (needs the hf extra)")
    p.add_argument("run", metavar="RUN", help="run folder or its model.safetensors")
    add_run_flag(p, "out", note="the export folder (config.json, model.safetensors, generation_config.json, "
                 "tokenizer.json); new or empty, outside the run folder", required=True)
    p.add_argument("--overwrite", action="store_true", help="replace the files of an earlier export in --out")
    p.set_defaults(func=cmd_export)
