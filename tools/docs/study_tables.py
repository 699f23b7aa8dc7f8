"""A study's committed data (docs/data) and the tables and plots generated from it alone.

Rules: docs/study-rules.md ("How the study is computed"); library: spe.lab.study_rules,
spe.lab.study_data, spe.lab.study_tables. Commands (from the repository root)::

    # runs -> docs/data/STUDY.jsonl + STUDY.meta.json (a finished `spe sweep` folder)
    python tools/docs/study_tables.py write --plan learned-time --runs runs/learned-time/bach \
        --study learned-time-bach --corpus "Bach chorales"
    # a `spe synth --plan` folder (OUT/ROW/config.json, OUT/ROW/seedK/result.json) -> the same files
    python tools/docs/study_tables.py write-synth --plan learned-time-flip-flop \
        --runs runs/synth/flip-flop --study learned-time-flip-flop
    # docs/data -> every <!-- table:STUDY --> block in docs/*.md and docs/study/STUDY.png
    python tools/docs/study_tables.py
    # the blocks that differ from their data (exit 1 if any; writes nothing)
    python tools/docs/study_tables.py --check
    # the longer-budget point: the four best rows on validation at the last bucket, 4x the steps
    python tools/docs/study_tables.py four-best --study learned-time-bach
    # rerun one committed seed into a new folder and compare it cell by cell with its record
    python tools/docs/study_tables.py reproduce --study learned-time-flip-flop --row gated-channel \
        --seed 3 --out runs/reproduce/ff-gated-channel-3
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from spe.lab.bench.tables import cost_row
from spe.lab.study_data import lra_folder_results, merge_study, read_study, sweep_study, synth_folder_results, \
    synth_study, write_study
from spe.lab.provenance import isa_caps
from spe.lab.study_rules import SELECTION_SPLIT, top_rows
from spe.lab.study_tables import drifted_blocks, growth_row, image_link, plot_budgets, plot_study, \
    render_budgets, render_study, replace_blocks, shown_buckets, study_blocks, summary_row

ROOT = Path(__file__).resolve().parents[2]
DATA, PLOTS, DOCS = ROOT / "docs" / "data", ROOT / "docs" / "study", ROOT / "docs"

# study -> the pairs of rows whose likeness the docs' wording rests on ("within 0.02 nats", "ties
# its twin", "does not help"): each block lists their equivalence test (TOST) on validation, so
# that the wording follows a test of the committed data, not the point estimates
EQUIVALENCE = {
    "learned-time-bach": [("sinespe-learned", "sinespe-whole"), ("sinespe-learned-gated", "sinespe-gated-whole"),
                          ("sinespe-learned-gated-channel", "sinespe-gated-channel-whole"), ("foxpro", "fox")],
    "learned-time-palestrina": [("sinespe-learned", "sinespe-whole"), ("sinespe-learned-gated", "sinespe-gated-whole"),
                                ("sinespe-learned-gated-channel", "sinespe-gated-channel-whole")],
    "learned-time-flip-flop": [("sinespe-learned-gated", "sinespe-gated"),
                               ("sinespe-learned-gated-channel", "sinespe-gated-channel")],
    "learned-time-mqar": [("sinespe-learned-gated", "sinespe-gated"),
                          ("sinespe-learned-gated-channel", "sinespe-gated-channel")],
    "learned-time-controls-bach": [("sinespe-softmax-learned", "sinespe-softmax-whole"),
                                   ("sinespe-softmax-learned-gated", "sinespe-softmax-gated-whole"),
                                   ("foxpro", "fox-shift")],
    "learned-time-mqar-controls": [("sinespe-softmax-learned", "sinespe-softmax-whole"),
                                   ("sinespe-softmax-learned-gated", "sinespe-softmax-gated-whole")],
    "learned-time-bach-4x-sinespe": [("sinespe-learned-gated-channel", "sinespe-gated-channel-whole")],
    # gates.md: "a short convolution leaves FoX where it was"
    "gates-bach": [("fox-conv", "fox")],
    # peers.md's older table read sineSPE + decay and RoPE + decay as level at 3 L on Palestrina
    "peers-palestrina": [("sinespe-decay", "rope-decay")],
    "learned-time-bach-8x": [("sinespe-learned-gated-channel", "sinespe-gated-channel-whole"), ("foxpro", "fox")],
    **{f"lra-fnet-{task}": [("fnet-ape", "softmax-ape"), ("fnet-ape", "performer-ape")] for task in ("listops", "text", "retrieval", "image")},
    # lra.md's "with one fixed code SPE is level with APE" and gates.md's "a gate alone reaches APE + softmax"
    "lra-listops-study": [("fixed-code", "ape-performer"), ("gated-channel-linear-elu", "ape-softmax"),
                          ("gated-performer", "ape-softmax"), ("sinespe-gated-performer", "ape-performer")],
}


# block -> (the studies of one plan and protocol at growing budgets, the rows compared): the claims
# at more than one budget (docs/learned-time-budgets.md), one study per budget (rows run later at a
# budget may come as a second study of it)
BUDGETS = {
    "learned-time-bach-budgets": (["learned-time-bach", "learned-time-bach-4x", "learned-time-bach-4x-sinespe",
                                   "learned-time-bach-8x"],
                                  ["path-fox", "foxpro", "fox", "gated-channel", "sinespe-gated-channel-whole",
                                   "sinespe-learned-gated-channel"]),
}


# block -> the rows of a results summary (README's "Main results"), each generated from one study's data
# (spe.lab.study_tables.summary_row): the rows named, and every row of the best group on validation;
# an entry with growth=True gives each row's growth from the first to the last shown bucket instead
# (spe.lab.study_tables.growth_row: the least-growth group, tested on validation)
SUMMARIES = {
    "readme-results": [
        dict(question="Music (Bach, L = 64), 16 L, 500 steps", study="learned-time-bach", split="test",
             rows=["path-fox", "foxpro", "fox", "gated-channel", "sinespe-learned-gated-channel", "sinespe", "ape"],
             source="[learned-time.md](docs/learned-time.md#bach-chorales-up-to-16-l)"),
        dict(question="Music (Bach, L = 64), 16 L, 4× the steps", study="learned-time-bach-4x", split="test",
             rows=["path-fox", "foxpro", "fox", "gated-channel"],
             source="[learned-time-budgets.md](docs/learned-time-budgets.md)"),
        dict(question="Music (Bach, L = 64), 16 L, 8× the steps", study="learned-time-bach-8x", split="test",
             rows=["path-fox", "foxpro", "fox", "gated-channel", "sinespe-learned-gated-channel",
                   "sinespe-gated-channel-whole"],
             source="[learned-time-budgets.md](docs/learned-time-budgets.md#the-rows-at-8-the-steps)"),
        dict(question="Music (Palestrina, L = 256), 16 L", study="learned-time-palestrina", split="test",
             rows=["path-fox", "foxpro", "fox", "gated-channel", "sinespe-learned-gated-channel", "sinespe", "ape"],
             source="[learned-time.md](docs/learned-time.md#palestrina-up-to-16-l)"),
        dict(question="Music (Bach, L = 64), 16 L, the tutorial's systems", study="tutorial-bach", split="test",
             rows=["music-transformer", "local-sinespe", "music-relative-whole", "sinespe", "fnet-causal", "ape"],
             source="[tutorial-study.md](docs/tutorial-study.md)"),
        dict(question="Music (Bach, L = 256), 3 L, SPE and its peers (the protocol has no test split)",
             study="peers-bach", split="validation", rows=["sinespe-decay", "rope-decay", "decay", "sinespe", "ape"],
             source="[peers.md](docs/peers.md#bach-chorales-music21-the-default-corpus)"),
        dict(question="Music (Bach, L = 256), up to 3 L, SPE and its peers", study="peers-bach", split="validation",
             growth=True, rows=["sinespe", "sinespe-decay", "ape", "rope", "lrpe"],
             source="[peers.md](docs/peers.md#bach-chorales-music21-the-default-corpus)"),
        dict(question="Music (Palestrina, L = 256), 3 L, SPE and its peers", study="peers-palestrina",
             split="validation", rows=["sinespe-decay", "rope-decay", "decay", "sinespe", "ape"],
             source="[peers.md](docs/peers.md#palestrina-music21-every-4th-of-its-1318-scores-330-pieces)"),
        dict(question="Music (Bach, L = 64, today's tokenizer), 16 L, the controls", study="learned-time-controls-bach",
             split="test", rows=["fox-shift", "foxpro", "fox", "sinespe-softmax-gated-whole", "sinespe-softmax-whole"],
             source="[learned-time-controls.md](docs/learned-time-controls.md)"),
        dict(question="MQAR (L = 64), 16 L, the preset's 2,000 steps", study="learned-time-mqar",
             split="test-same-pairs", bucket=(1024, 1024),
             rows=["foxpro", "fox", "path-fox", "gated-channel", "sinespe-learned-gated", "ape"],
             source="[learned-time.md](docs/learned-time.md#mqar-up-to-64-l)"),
        dict(question="Flip-flop (L = 64), 16 L", study="learned-time-flip-flop", split="test-sparse",
             bucket=(1024, 1024), rows=["path-fox", "foxpro", "fox", "gated-channel", "sinespe-learned-gated", "ape"],
             source="[learned-time.md](docs/learned-time.md#flip-flop-up-to-64-l)"),
        dict(question="ListOps (cpu-small, L = 300), 2,000 steps", study="lra-listops-study", split="test",
             rows=["ape-softmax", "ape-performer", "fixed-code", "sinespe-performer", "gated-channel-linear-elu",
                   "gated-performer", "sinespe-gated-performer"],
             source="[gates.md](docs/gates.md#the-listops-studys-gated-rows-bidirectional-gates), [lra.md](docs/lra.md)"),
        dict(question="Cost of the main job's model", bench="cpu-model", batch=8, length=2048,
             source="[cpu-model.md](docs/bench/cpu-model.md)"),
    ],
}


def render_summary(name: str, data: Path = DATA) -> str:
    rows = []
    for entry in SUMMARIES[name]:
        if "bench" in entry:  # a spe bench --modes model run's JSON, docs/data/bench/NAME.json
            payload = json.loads((data / "bench" / f"{entry['bench']}.json").read_text())
            rows.append(cost_row(payload, question=entry["question"], batch=entry["batch"], length=entry["length"],
                                 source=entry["source"]))
            continue
        records, meta = read_study(data, entry["study"])
        if entry.get("growth"):  # growth from the first to the last shown bucket, tested on validation
            rows.append(growth_row(records, meta, question=entry["question"], split=entry["split"],
                                   rows=entry["rows"], source=entry["source"]))
            continue
        bucket = entry.get("bucket")
        rows.append(summary_row(records, meta, question=entry["question"], split=entry["split"], rows=entry["rows"],
                                source=entry["source"], bucket=None if bucket is None else tuple(bucket)))
    return "\n".join(["| question | result: mean ± sample std (n − 1) (seeds) | source |", "|---|---|---|", *rows, ""])


def budget_studies(name: str, data: Path = DATA) -> tuple[list, list[str]]:
    studies, rows = BUDGETS[name]
    return [read_study(data, s) for s in studies], rows


def render(name: str, doc: Path, data: Path = DATA, plots: Path = PLOTS) -> str:
    """The generated body of study ``name``'s block in ``doc``, from ``data`` alone."""
    if name in SUMMARIES:
        return render_summary(name, data)
    if name in BUDGETS:
        studies, rows = budget_studies(name, data)
        link = image_link(doc, plots / f"{name}.png")
        return "\n".join([*render_budgets(studies, rows), "", f"![{name}]({link})", ""])
    if not (data / f"{name}.jsonl").exists():
        raise SystemExit(f"{doc} has a block <!-- table:{name} --> but {data}/{name}.jsonl does not exist")
    records, meta = read_study(data, name)
    return render_study(records, meta, image=image_link(doc, plots / f"{name}.png"),
                        equivalence=EQUIVALENCE.get(name, ()))


def docs_with_blocks(docs: Path = DOCS) -> list[Path]:
    pages = [*sorted(docs.rglob("*.md")), *([ROOT / "README.md"] if docs == DOCS else [])]
    return [p for p in pages if study_blocks(p.read_text())]


def unshown_studies(data: Path = DATA, docs: Path = DOCS) -> list[str]:
    """Studies in ``data`` that no doc's block shows."""
    shown = {name for doc in docs_with_blocks(docs) for name in study_blocks(doc.read_text())}
    return [p.name[:-6] for p in sorted(data.glob("*.jsonl")) if p.name[:-6] not in shown]


def cmd_render(args) -> int:
    docs = docs_with_blocks()
    if args.check:
        drifted = [f"{doc.relative_to(ROOT)}: {name}" for doc in docs for name in drifted_blocks(doc, render)]
        missing = unshown_studies()
        for line in drifted:
            print(f"drifted from docs/data: {line}")
        for name in missing:
            print(f"no doc shows docs/data/{name}.jsonl (add <!-- table:{name} --> <!-- /table --> to a doc)")
        return 1 if drifted or missing else 0
    for doc in docs:
        names = study_blocks(doc.read_text())
        doc.write_text(replace_blocks(doc.read_text(), {n: render(n, doc) for n in names}))
        for name in names:
            if name in SUMMARIES:
                continue
            if name in BUDGETS:
                plot_budgets(*budget_studies(name), PLOTS / f"{name}.png")
            else:
                plot_study(*read_study(DATA, name), PLOTS / f"{name}.png")
        print(f"wrote {doc.relative_to(ROOT)}: {', '.join(names)}")
    return 0


def cmd_write(args) -> int:
    from spe.lab.plans import load_plan

    plan = load_plan(args.plan, "music")
    records, meta = sweep_study(plan, args.runs, study=args.study, corpus=args.corpus, command="")
    ran_here = records
    if args.rows_from:
        records, meta = _rows_from(plan, args, records, meta)
    ran = [n for n in meta["rows"] if n in {r["variant"] for r in records}]
    # the default command says what ran: the rows (when not the whole plan) and the steps
    command = args.command or shlex.join(["spe", "sweep", "--plan", args.plan,
                                          *(["--only", ",".join(ran)] if len(ran) < len(plan.rows) else []),
                                          *(["--steps", str(args.steps)] if args.steps else []),
                                          "--out", args.runs, *(["--data", args.data] if args.data else [])])
    if args.rows_from and not args.command:
        shared = sorted({r["variant"] for r in records} - {r["variant"] for r in ran_here})
        source = args.rows_from if Path(args.rows_from).is_dir() else f"the committed study {args.rows_from}"
        command += f"   # {', '.join(shared)}: the runs of {source} (the same experiments)"
    meta = {**meta, "command": command}
    if args.steps:  # only the rows that ran, at the steps they ran
        meta = {**meta, "steps": args.steps, "rows": {n: r for n, r in meta["rows"].items() if n in ran}}
    if args.title:
        meta = {**meta, "title": args.title}
    return _write(args, records, meta)


def _rows_from(plan, args, records: list[dict], meta: dict) -> tuple[list[dict], dict]:
    """``records`` and ``meta`` with the runs of the plan's rows that ``--runs`` lacks, taken from
    ``--rows-from`` (another plan's sweep folder, or a study committed under ``--data-dir``) where
    each is the same experiment as this plan's row and seed: its recorded ``experiment_sha256``
    equals the hash of this plan's resolved config (with ``--data`` and ``--steps``). One training
    then serves two studies instead of running twice, also once its folder is gone.

    Raises:
        ValueError: naming the row, seed and both hashes, for a run that is another experiment or
            records none; if ``--rows-from`` holds no run of a row that ``--runs`` lacks, or is
            neither a folder nor a committed study.
    """
    from spe.lab.music.plan import MusicPlans
    from spe.lab.provenance import experiment_hash

    have = {r["variant"] for r in records}
    other, other_meta = _other_runs(plan, args)
    taken = [{**r, "study": args.study} for r in other if r["variant"] not in have]
    if not taken:
        raise ValueError(f"--rows-from {args.rows_from}: no finished run of a row of plan {args.plan!r} that "
                         f"{args.runs} lacks")
    task = MusicPlans(plan, args.runs, progress=False, data=args.data, steps=args.steps)
    recorded = other_meta.get("provenance", {})
    for row, seed in sorted({(r["variant"], r["seed"]) for r in taken}):
        found = recorded.get(row, {}).get(str(seed), {}).get("experiment_sha256")
        wanted = experiment_hash(task.config(row, seed))
        if found != wanted:
            raise ValueError(f"--rows-from {args.rows_from}: {row} seed {seed} is not plan {args.plan!r}'s experiment "
                             f"(its experiment_sha256 {found!r}, the plan's {wanted!r}; --data {args.data!r})")
    rows = {r["variant"] for r in taken}
    print(f"took {len({(r['variant'], r['seed']) for r in taken})} run(s) of {', '.join(sorted(rows))} from "
          f"{args.rows_from} (the same experiments)")
    provenance = {**meta.get("provenance", {}), **{row: recorded[row] for row in sorted(rows)}}
    return records + taken, {**meta, "provenance": provenance}


def _other_runs(plan, args) -> tuple[list[dict], dict]:
    """The runs ``--rows-from`` names: a sweep folder's, else the committed study of that name."""
    if Path(args.rows_from).is_dir():
        return sweep_study(plan, args.rows_from, study=args.study, corpus=args.corpus, command="")
    if (Path(args.data_dir) / f"{args.rows_from}.jsonl").exists():  # only this plan's rows, as a folder gives
        records, meta = read_study(args.data_dir, args.rows_from)
        return [r for r in records if r["variant"] in plan.rows], meta
    raise ValueError(f"--rows-from {args.rows_from}: neither a sweep folder nor a study in {args.data_dir} "
                     f"({args.data_dir}/{args.rows_from}.jsonl does not exist)")


def _write(args, records: list[dict], meta: dict) -> int:
    """Writes the study; with ``--merge``, the committed study's runs that these lack are kept."""
    if args.merge:
        if not (Path(args.data_dir) / f"{meta['study']}.jsonl").exists():
            raise ValueError(f"--merge: {args.data_dir}/{meta['study']}.jsonl does not exist: there is nothing to "
                             "merge with (leave out --merge to write the study)")
        kept = read_study(args.data_dir, meta["study"])
        ran = {(r["variant"], r["seed"]) for r in records}
        records, meta = merge_study(kept, (records, meta))
        print(f"kept {len({(r['variant'], r['seed']) for r in kept[0]} - ran)} committed run(s) that these "
              f"{len(ran)} do not replace")
    for path in write_study(args.data_dir, records, meta, allow_dirty=args.allow_dirty):
        print(f"wrote {path}")
    return 0


def cmd_write_synth(args) -> int:
    descriptions, title = {}, args.title
    if args.plan:  # the rows' descriptions and the title from the packaged synth plan
        from spe.lab.plans import load_plan

        plan = load_plan(args.plan, "synth")
        descriptions, title = {n: r["description"] for n, r in plan.rows.items()}, title or plan.title
    runs, rows = synth_folder_results(args.runs, descriptions=descriptions)
    command = args.command or shlex.join(["spe", "synth", *(["--plan", args.plan] if args.plan else []),
                                          "--out", args.runs])
    records, meta = synth_study(runs, study=args.study, title=title or args.study, command=command, rows=rows)
    return _write(args, records, meta)


# The options of a study's recorded command that a reproduction keeps (the others name the
# runners' folders, rows and seeds, which the reproduction sets itself).
_KEPT = ("--plan", "--data", "--steps")
_SET_HERE = ("--seeds", "--out", "--threads")  # what a reproduction of one spe lra experiment sets itself


def reproduction_command(meta: dict, row: str, seed: int, out: str, threads: int) -> list[str]:
    """The ``spe`` command line (after ``spe``) that reruns ``row``'s seed ``seed`` of a study into
    ``out``: its recorded command's subcommand (``sweep``, ``lra`` or ``synth``) and ``--plan``, ``--data``
    and ``--steps``, with ``--only ROW --seeds SEED --out OUT --threads N``; a study of ``spe lra``
    experiments (each row its folder): the row's own command (``meta["rows"][row]["command"]``, else
    the study's) whole, with ``--seeds SEED --out OUT/ROW --threads N``.

    Raises:
        ValueError: if the recorded command is not an ``spe sweep`` / ``spe synth --plan`` one, or
            ``row`` is not a row of the study.
    """
    if row not in meta["rows"]:
        raise ValueError(f"study {meta['study']!r} has no row {row!r}; its rows: {', '.join(meta['rows'])}")
    words = shlex.split(meta["rows"][row].get("command", meta["command"]).split("#", 1)[0])
    if words[:2] == ["spe", "lra"] and "--plan" not in words:  # one experiment, in OUT/ROW: rerun as it ran
        kept = [w for i, w in enumerate(words[2:], 2) if w not in _SET_HERE and words[i - 1] not in _SET_HERE
                and w != "--no-progress"]
        return ["lra", *kept, "--seeds", str(seed), "--out", f"{out}/{row}", "--threads", str(threads),
                "--no-progress"]
    if words[:2] not in (["spe", "sweep"], ["spe", "synth"], ["spe", "lra"]) or "--plan" not in words:
        raise ValueError(f"study {meta['study']!r} was made by {meta['command']!r}: only an spe sweep, spe lra "
                         "or spe synth --plan study, or one spe lra experiment, can be rerun from its record")
    kept = [w for i, w in enumerate(words[2:], 2)
            if w in _KEPT or (words[i - 1] in _KEPT and not w.startswith("--"))]
    if "--steps" not in kept and meta.get("steps") and words[1] == "sweep":
        kept += ["--steps", str(meta["steps"])]
    return [words[1], *kept, "--only", row, "--seeds", str(seed), "--out", out, "--threads", str(threads),
            "--no-progress"]


def compare_cells(committed: list[dict], rerun: list[dict]) -> dict:
    """Cells (split, bucket) of one run, committed against rerun: ``cells`` (the keys both hold),
    ``differ`` (key, committed value, rerun value) where the values are not bit-identical,
    ``missing`` (keys of the committed run the rerun lacks)."""
    def key(r):
        return r["split"], r["bucket_start"], r["bucket_end"]

    new = {key(r): r["value"] for r in rerun}
    both = [r for r in committed if key(r) in new]
    return {"cells": len(both), "missing": [key(r) for r in committed if key(r) not in new],
            "differ": [(key(r), r["value"], new[key(r)]) for r in both if repr(r["value"]) != repr(new[key(r)])]}


# config_sha256 covers a music run's folder, so it differs for every rerun elsewhere; experiment_sha256
# (spe.lab.provenance.experiment_hash) is the one that says whether the same experiment was asked for
_ENVIRONMENT = ("commit", "dirty", "torch", "python", "threads", "device", "cpu", "cpu_isa",
                "cpu_capability", "isa_limits", "experiment_sha256", "config_sha256")


def cmd_reproduce(args) -> int:
    import subprocess

    records, meta = read_study(Path(args.data_dir), args.study)
    committed = [r for r in records if r["variant"] == args.row and r["seed"] == args.seed]
    if not committed:
        raise ValueError(f"study {args.study!r} holds no record of row {args.row!r} seed {args.seed}")
    command = reproduction_command(meta, args.row, args.seed, args.out, args.threads)
    print("spe " + shlex.join(command), flush=True)
    done = subprocess.run([sys.executable, "-m", "spe", "-q", *command])
    if done.returncode:
        raise ValueError(f"the rerun failed (exit {done.returncode}); its folder: {args.out}")
    if command[0] == "sweep":
        from spe.lab.plans import load_plan

        rerun, rerun_meta = sweep_study(load_plan(command[command.index("--plan") + 1], "music"), args.out, study=args.study,
                                        corpus=meta["corpus_or_task"], command="reproduction")
    else:
        runs, rows = (lra_folder_results if command[0] == "lra" else synth_folder_results)(args.out)
        rerun, rerun_meta = synth_study(runs, study=args.study, title="reproduction", command="reproduction",
                                        rows=rows)
    rerun = [r for r in rerun if r["variant"] == args.row and r["seed"] == args.seed]
    found = compare_cells(committed, rerun)
    then = meta.get("provenance", {}).get(args.row, {}).get(str(args.seed))
    now = rerun_meta.get("provenance", {}).get(args.row, {}).get(str(args.seed), {})
    print(f"{args.study} {args.row} seed {args.seed}: {found['cells']} cells compared, "
          f"{len(found['differ'])} differ, {len(found['missing'])} missing from the rerun")
    for (split, start, end), old, new in found["differ"]:
        print(f"  {split} [{start}, {end}): committed {old!r}, rerun {new!r}")
    if then is None:
        print("  the committed run recorded no provenance: its commit, threads and versions are unknown")
    else:
        for name in _ENVIRONMENT:
            if name not in then:  # a record written before the field existed
                print(f"  {name}: not recorded by the committed run (rerun {now.get(name)!r})")
                continue
            same = then.get(name) == now.get(name)
            print(f"  {name}: {'same' if same else 'differs'} (committed {then.get(name)!r}, rerun {now.get(name)!r})")
        caps = isa_caps(then, now) if found["differ"] else None
        if caps:
            print("  to follow the committed run's instruction sets, rerun with "
                  + " ".join(f"{k}={v}" for k, v in caps.items()) + " set (docs/study-rules.md)")
    return 0 if not found["differ"] and not found["missing"] else 1


def cmd_write_lra(args) -> int:
    runs, rows = lra_folder_results(args.runs)
    if not runs:
        raise ValueError(f"no finished spe lra seed under {args.runs}/ROW/seedK/result.json")
    title = args.title
    if args.plan:  # an spe lra --plan folder: the rows' descriptions and the title from the plan
        from spe.lab.plans import load_plan

        plan = load_plan(args.plan, "lra")
        strangers = sorted(set(rows) - set(plan.rows))
        if strangers:
            raise ValueError(f"{args.runs} holds rows {strangers} that plan {args.plan!r} does not have")
        rows = {name: {**row, "description": plan.rows[name]["description"]} for name, row in rows.items()}
        title = title or plan.title
    for name, description in (args.describe or []):
        if name not in rows:
            raise ValueError(f"--describe {name}: no row {name!r} under {args.runs}; rows: {', '.join(rows)}")
        rows[name] = {**rows[name], "description": description}
    for name, command in (args.row_command or []):
        if name not in rows:
            raise ValueError(f"--row-command {name}: no row {name!r} under {args.runs}; rows: {', '.join(rows)}")
        rows[name] = {**rows[name], "command": command}
    command = args.command or "\n".join(
        [row["command"] for row in rows.values() if "command" in row]
        or [shlex.join(["spe", "lra", "--plan", args.plan, "--out", args.runs] if args.plan else
                       ["spe", "lra", "--task", runs[0]["task"], "--out", args.runs + "/ROW"])])
    records, meta = synth_study(runs, study=args.study, title=title or args.study, command=command, rows=rows)
    for path in write_study(args.data_dir, records, meta, allow_dirty=args.allow_dirty):
        print(f"wrote {path}")
    return 0


def four_best_command(records: list[dict], meta: dict, *, k: int = 4, factor: int = 4) -> str:
    """The ``spe sweep`` command of the longer-budget point: the ``k`` rows of best validation mean
    in the last shown bucket, at ``factor`` × the plan's steps, into their own folder."""
    if "plan" not in meta:
        raise SystemExit(f"study {meta['study']!r} was not made by a sweep plan: no command to write")
    values = {}
    for r in records:
        if r["split"] == SELECTION_SPLIT:
            bucket = values.setdefault((r["bucket_start"], r["bucket_end"]), {})
            bucket.setdefault(r["variant"], []).append(r["value"])
    last = shown_buckets(list(values), meta["metric"], meta["train_length"])[-1]
    rows = top_rows(values[last], meta["metric"], k)
    # the recorded command may carry a shell comment with prose after it (apostrophes included)
    parts = shlex.split(meta["command"], comments=True)
    out = parts[parts.index("--out") + 1] if "--out" in parts else f"runs/{meta['study']}"
    data = ["--data", parts[parts.index("--data") + 1]] if "--data" in parts else []
    return shlex.join(["spe", "sweep", "--plan", meta["plan"], "--only", ",".join(rows),
                       "--steps", str(factor * meta["steps"]), "--out", f"{out}-{factor}x", *data])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="report blocks that differ from docs/data; write nothing")
    sub = parser.add_subparsers(dest="cmd")
    w = sub.add_parser("write", help="a finished spe sweep folder -> docs/data/STUDY.jsonl and .meta.json")
    w.add_argument("--plan", required=True)
    w.add_argument("--runs", required=True, help="the sweep's --out folder")
    w.add_argument("--study", required=True)
    w.add_argument("--corpus", required=True, help="e.g. 'Bach chorales' or music21:palestrina/2")
    w.add_argument("--data", help="the sweep's --data, if any (written into the command)")
    w.add_argument("--rows-from", metavar="FOLDER|STUDY",
                   help="another plan's sweep folder, or a study committed in --data-dir: the plan's rows that "
                        "--runs lacks are taken from its runs where each is the same experiment (equal "
                        "experiment_sha256, checked)")
    w.add_argument("--command", help="the command that made the runs (default: spe sweep with these options)")
    w.add_argument("--title", help="the table's title (default: the plan's)")
    w.add_argument("--steps", type=int, help="the runs' steps where --steps overrode the plan's (the 4x point)")
    w.add_argument("--data-dir", default=str(DATA))
    w.add_argument("--allow-dirty", action="store_true",
                   help="write runs made from a source tree with uncommitted changes too (refused by default)")
    w.add_argument("--merge", action="store_true",
                   help="keep the committed study's runs (row, seed) that these runs lack: a study rerun part by part")
    s = sub.add_parser("write-synth", help="a spe synth --plan folder -> docs/data/STUDY.jsonl and meta")
    s.add_argument("--runs", required=True, help="the plan's --out folder (OUT/ROW/seedK/result.json)")
    s.add_argument("--study", required=True)
    s.add_argument("--plan", help="the synth plan (rows' descriptions, title)")
    s.add_argument("--title")
    s.add_argument("--command", help="the command that made the runs (default: spe synth --plan P --out R)")
    s.add_argument("--data-dir", default=str(DATA))
    s.add_argument("--allow-dirty", action="store_true",
                   help="write runs made from a source tree with uncommitted changes too (refused by default)")
    s.add_argument("--merge", action="store_true",
                   help="keep the committed study's runs (row, seed) that these runs lack: a study rerun part by part")
    a = sub.add_parser("write-lra", help="a folder of spe lra experiments of one task (OUT/ROW) -> the same files")
    a.add_argument("--runs", required=True, help="the folder whose subfolders are spe lra --out folders")
    a.add_argument("--study", required=True)
    a.add_argument("--plan", help="the spe lra plan of an spe lra --plan folder (rows' descriptions, title, command)")
    a.add_argument("--title")
    a.add_argument("--command", help="the commands that made the runs")
    a.add_argument("--describe", nargs=2, action="append", metavar=("ROW", "TEXT"),
                   help="a row's description (default: its attention + positional)")
    a.add_argument("--row-command", nargs=2, action="append", metavar=("ROW", "COMMAND"),
                   help="the spe lra command that made a row's folder (what reproduce reruns for that row; "
                        "the study's --command defaults to these, one a line)")
    a.add_argument("--data-dir", default=str(DATA))
    a.add_argument("--allow-dirty", action="store_true",
                   help="write runs made from a source tree with uncommitted changes too (refused by default)")
    r = sub.add_parser("reproduce", help="rerun one committed seed of a study and compare it cell by cell "
                                         "(exit 0: bit-identical, 1: cells differ)")
    r.add_argument("--study", required=True)
    r.add_argument("--row", required=True)
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--out", required=True, help="a new folder for the rerun (the study's runs are never touched)")
    r.add_argument("--threads", type=int, default=1, help="torch threads of the rerun (default 1, as the studies)")
    r.add_argument("--data-dir", default=str(DATA))
    f = sub.add_parser("four-best", help="print the spe sweep command of the longer-budget point")
    f.add_argument("--study", required=True)
    f.add_argument("--k", type=int, default=4)
    f.add_argument("--factor", type=int, default=4)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "write":
            return cmd_write(args)
        if args.cmd == "write-synth":
            return cmd_write_synth(args)
        if args.cmd == "write-lra":
            return cmd_write_lra(args)
        if args.cmd == "reproduce":
            return cmd_reproduce(args)
        if args.cmd == "four-best":
            print(four_best_command(*read_study(DATA, args.study), k=args.k, factor=args.factor))
            return 0
        return cmd_render(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"study_tables: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
