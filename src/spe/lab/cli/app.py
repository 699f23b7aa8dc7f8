"""``spe app``: parsing and printing only; the page is :mod:`spe.lab.app.page`, its work
:mod:`spe.lab.app.core`."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_app_parser", "cmd_app"]


def _models(run: str | None) -> list[Path]:
    """The models the page offers: ``run`` (opened now, so a bad one is the message before the
    server starts), else every run and export under the current folder."""
    from spe.lab.app.core import find_models, open_model

    if run:
        open_model(run)
        return [Path(run)]
    found = find_models(".")
    if not found:
        raise ValueError(f"no music run or spe export folder under {Path.cwd()}: give one with --run")
    return found


def cmd_app(args: argparse.Namespace) -> int:
    from spe.lab.app.page import require_gradio, serve
    from spe.lab.options import set_threads

    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be a TCP port from 1 to 65535, got {args.port}")
    if not args.host.strip():
        raise ValueError("--host must name an address to listen on, got an empty one")
    require_gradio()  # missing Gradio is the message before a model is read
    set_threads(args.threads, "--threads")
    models = _models(args.run)
    print(f"spe app: {len(models)} model(s); open http://{args.host}:{args.port} (Ctrl-C stops it)", flush=True)
    serve(models, host=args.host, port=args.port)
    return 0


def add_app_parser(sub) -> None:
    from spe.lab.cli.names import add_run_flag

    p = sub.add_parser("app", help="a page to listen to a model: prompt, generate, piano roll, audio, MIDI "
                       "(needs the app extra)")
    p.add_argument("--run", metavar="RUN_OR_EXPORT",
                   help="a run folder (or its model.safetensors) or an spe export folder (default: every one "
                   "found under the current folder)")
    p.add_argument("--port", type=int, default=7860, help="TCP port to listen on")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every network)")
    add_run_flag(p, "threads")
    p.set_defaults(func=cmd_app)
