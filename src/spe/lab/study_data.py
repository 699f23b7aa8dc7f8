"""Per-seed study results as committed data: ``docs/data/<study>.jsonl`` and its ``<study>.meta.json``.

Every table and plot of a study is generated from these files alone
(:mod:`spe.lab.study_tables`, ``python tools/docs/study_tables.py``), so anyone can recompute
them, and a test keeps the docs equal to them.

**Records.** One JSON object per line with exactly the fields of :data:`FIELDS`, in that order:

* ``study``: the study's name (the file's stem), e.g. ``learned-time-bach``.
* ``corpus_or_task``: the corpus (``Bach chorales``, ``music21:palestrina/2``) or synthetic task
  (``flip-flop``, ``mqar``).
* ``variant``: the row; ``seed``: its training seed (int ≥ 0).
* ``split``: ``validation`` (the split rows, repeats and best groups are chosen on:
  :data:`spe.lab.study_rules.SELECTION_SPLIT`), ``test`` (reported only), or a task's other
  reported split (e.g. ``test-dense``).
* ``bucket_start``, ``bucket_end``: for a language model, the positions [start, end) whose
  cross-entropy is averaged (buckets of L); for a synthetic task, both equal the evaluated
  sequence length (a point, not a range).
* ``value``, ``metric``: ``cross_entropy`` in nats/token (lower is better) or ``accuracy`` as a
  fraction in [0, 1] (higher is better); the keys of :data:`spe.lab.study_rules.METRICS`.
* ``train_tokens``: tokens the run trained on (optimizer steps × batch × training length).
* ``params``: the model's parameter count.

**Meta** (``<study>.meta.json``): what the tables say beside the numbers: ``study``, ``title``,
``command`` (how the runs were made), ``corpus_or_task``, ``metric``, ``train_length`` (L),
``plan`` and ``steps`` (for a sweep: the packaged plan and its steps, from which the
longer-budget command is written), and ``rows``: row -> ``{"description", "window"}`` in the
plan's order (the window in words: ``"L = 64"``, ``"whole past"``); ``provenance`` (where the runs
recorded it): row -> seed (a string) -> the run's :mod:`spe.lab.provenance` record without its
config (commit, dirty, config hash, threads, device, versions, CPU, host, times).

**Sources.** :func:`sweep_study` reads a ``spe sweep`` folder (each run's ``result.json``: its
eval split's ``buckets`` and, for the test split, ``validation``). :func:`synth_folder_results`
reads a ``spe synth --plan`` folder and :func:`synth_study` turns runs (its docstring gives the input it expects) into records.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path

from spe.checkpoint import atomic_write
from spe.lab import plans
from spe.lab.options import read_json_object, rename_old_names
from spe.lab.study_rules import METRICS

__all__ = ["FIELDS", "META_KEYS", "check_meta", "check_record", "dirty_runs", "lra_folder_results", "merge_study",
           "read_study", "record_key", "run_provenance", "sweep_study", "synth_folder_results", "synth_study",
           "window_words", "write_study"]

FIELDS = ("study", "corpus_or_task", "variant", "seed", "split", "bucket_start", "bucket_end", "value",
          "metric", "train_tokens", "params")
_KEY = ("variant", "seed", "split", "bucket_start", "bucket_end")  # one record per key
META_KEYS = ("study", "title", "command", "corpus_or_task", "metric", "train_length", "rows")
_INTS = ("seed", "bucket_start", "bucket_end", "train_tokens", "params")


def check_record(record: dict, where: str = "record") -> dict:
    """``record`` if it has exactly :data:`FIELDS` with valid values (``value`` NaN where written null).

    Raises:
        ValueError: naming ``where`` and the field.
    """
    if set(record) != set(FIELDS):
        raise ValueError(f"{where}: fields must be exactly {', '.join(FIELDS)}; missing "
                         f"{sorted(set(FIELDS) - set(record))}, unknown {sorted(set(record) - set(FIELDS))}")
    for key in _INTS:
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{where}: {key} must be an integer ≥ 0, got {value!r}")
    if record["bucket_end"] < record["bucket_start"]:
        raise ValueError(f"{where}: bucket_end {record['bucket_end']} < bucket_start "
                         f"{record['bucket_start']}")
    if record["metric"] not in METRICS:
        raise ValueError(f"{where}: metric must be one of {', '.join(METRICS)}, got {record['metric']!r}")
    for key in ("study", "corpus_or_task", "variant", "split"):
        if not isinstance(record[key], str) or not record[key]:
            raise ValueError(f"{where}: {key} must be a non-empty string, got {record[key]!r}")
    value = record["value"]
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{where}: value must be a number (or null), got {value!r}")
    return {**record, "value": math.nan if value is None else float(value)}


def record_key(record: dict) -> tuple:
    """What one record measures: (variant, seed, split, bucket_start, bucket_end)."""
    return tuple(record[k] for k in _KEY)


def _key_words(key: tuple) -> str:
    return ", ".join(f"{name} {value!r}" for name, value in zip(_KEY, key))


def _check_unique(records: Iterable[dict], where: Callable[[int], str]) -> None:
    """Refuses two records of one :func:`record_key` (a careless merge: the last would win unseen).

    Raises:
        ValueError: ``where(i)`` of the second, the key, and ``where`` of the first.
    """
    seen: dict[tuple, int] = {}
    for i, record in enumerate(records):
        key = record_key(record)
        if key in seen:
            raise ValueError(f"{where(i)}: a second record of ({_key_words(key)}); the first is at "
                             f"{where(seen[key])}: keep one")
        seen[key] = i


def check_meta(meta: object, where: str = "meta") -> dict:
    """``meta`` if it holds what the tables need (module docstring, "Meta").

    Raises:
        ValueError: naming ``where`` and the key that is missing or of the wrong type.
    """
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: a study's meta must be a JSON object, got {type(meta).__name__}")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)} (a study's meta holds {', '.join(META_KEYS)})")
    if meta["metric"] not in METRICS:
        raise ValueError(f"{where}: metric must be one of {', '.join(METRICS)}, got {meta['metric']!r}")
    length = meta["train_length"]
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"{where}: train_length must be an integer ≥ 1, got {length!r}")
    rows = meta["rows"]
    if not isinstance(rows, dict) or not all(isinstance(r, dict) for r in rows.values()):
        raise ValueError(f"{where}: rows must map each row to {{\"description\", \"window\"}}, got {rows!r}")
    for key in ("study", "title", "command", "corpus_or_task"):
        if not isinstance(meta[key], str):
            raise ValueError(f"{where}: {key} must be a string, got {meta[key]!r}")
    return meta


def read_study(folder: str | Path, study: str) -> tuple[list[dict], dict]:
    """(records, meta) of ``folder/<study>.jsonl`` and ``folder/<study>.meta.json``.

    Raises:
        FileNotFoundError: if either file is missing.
        ValueError: naming the file and line, on a line that is not a JSON object, a bad record,
            a record of another study or a second record of one :func:`record_key`; naming the
            meta file, on a meta that is not JSON or lacks a key (:func:`check_meta`).
    """
    folder = Path(folder)
    path = folder / f"{study}.jsonl"
    records, lines = [], []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: a record must be a JSON object, got {type(record).__name__}")
        record = check_record(record, f"{path}:{number}")
        if record["study"] != study:
            raise ValueError(f"{path}:{number}: study {record['study']!r} in the file of {study!r}")
        records.append(record)
        lines.append(number)
    _check_unique(records, lambda i: f"{path}:{lines[i]}")
    meta_path = folder / f"{study}.meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path} does not exist (the meta of {path})")
    return records, check_meta(read_json_object(meta_path, "a study's meta"), str(meta_path))


def _line(record: dict) -> str:
    value = record["value"]
    ordered = {k: (None if k == "value" and not math.isfinite(value) else record[k]) for k in FIELDS}
    return json.dumps(ordered, ensure_ascii=False, allow_nan=False)


def dirty_runs(meta: dict) -> list[str]:
    """``ROW seed S`` of every run in ``meta["provenance"]`` made from a source tree with changes
    not committed (its ``dirty`` flag), in order."""
    return [f"{row} seed {seed}" for row, by_seed in meta.get("provenance", {}).items()
            for seed, record in by_seed.items() if record.get("dirty")]


def run_provenance(result: dict) -> dict | None:
    """A run's provenance as study meta keeps it (without its config), None if it has none."""
    record = result.get("provenance")
    return None if not isinstance(record, dict) else {k: v for k, v in record.items() if k != "config"}


def _with_provenance(meta: dict, by_row: dict[str, dict[int, dict]]) -> dict:
    """``meta`` with ``provenance`` from the runs' results (row -> seed -> result), where any run has one."""
    found = {row: {str(seed): p for seed, result in by_seed.items() if (p := run_provenance(result))}
             for row, by_seed in by_row.items()}
    found = {row: by_seed for row, by_seed in found.items() if by_seed}
    return {**meta, "provenance": found} if found else meta


def write_study(folder: str | Path, records: Iterable[dict], meta: dict, *,
                allow_dirty: bool = False) -> tuple[Path, Path]:
    """Writes ``folder/<study>.jsonl`` (checked records, sorted by variant, seed, split and bucket)
    and ``folder/<study>.meta.json``; returns both paths.

    Args:
        allow_dirty: write runs made from a source tree with uncommitted changes too (their
            provenance says so); by default they are refused, since their code cannot be checked out.

    Raises:
        ValueError: on a bad record or meta, a record whose study is not ``meta["study"]``, two
            records of one :func:`record_key`, or (unless ``allow_dirty``) runs from a dirty tree.
    """
    study, folder = check_meta(meta)["study"], Path(folder)
    dirty = dirty_runs(meta)
    if dirty and not allow_dirty:
        raise ValueError(f"study {study!r}: {len(dirty)} run(s) were made from a source tree with uncommitted "
                         f"changes ({', '.join(dirty[:4])}{', …' if len(dirty) > 4 else ''}): their code cannot be "
                         "checked out again; rerun them from a commit, or allow it (--allow-dirty)")
    records = [check_record(r, f"record {i}") for i, r in enumerate(records)]
    if any(r["study"] != study for r in records):
        raise ValueError(f"every record must belong to study {study!r}")
    _check_unique(records, lambda i: f"record {i}")
    records.sort(key=lambda r: (r["variant"], r["seed"], r["split"], r["bucket_start"], r["bucket_end"]))
    folder.mkdir(parents=True, exist_ok=True)
    jsonl, meta_path = folder / f"{study}.jsonl", folder / f"{study}.meta.json"
    atomic_write(jsonl, lambda tmp: Path(tmp).write_text("".join(_line(r) + "\n" for r in records)))
    meta_text = json.dumps(meta, indent=2, ensure_ascii=False) + "\n"
    atomic_write(meta_path, lambda tmp: Path(tmp).write_text(meta_text))
    return jsonl, meta_path


# What two parts of one study must share to be merged: the same measurement of the same runs' recipe.
_MERGE_KEYS = ("corpus_or_task", "metric", "train_length", "plan", "steps")


def merge_study(kept: tuple[list[dict], dict], new: tuple[list[dict], dict]) -> tuple[list[dict], dict]:
    """(records, meta) of ``new`` plus every run (row, seed) of ``kept`` that ``new`` lacks: a
    study whose rows are rerun a few at a time is written part by part, each run with its own
    records and provenance (a row whose seeds then span commits is flagged by its table).

    Args:
        kept: the committed study (:func:`read_study`).
        new: the study of the runs just made (e.g. :func:`sweep_study`); its meta (title, command,
            rows' descriptions) wins, and its rows come first, then the kept rows it lacks in their order.

    Raises:
        ValueError: naming the key, if the two differ in study, corpus, metric, training length,
            plan or steps (their runs would not be one study's).
    """
    (old_records, old_meta), (new_records, new_meta) = kept, new
    for key in ("study", *_MERGE_KEYS):
        if old_meta.get(key) != new_meta.get(key):
            raise ValueError(f"study {new_meta.get('study')!r}: the committed runs have {key} "
                             f"{old_meta.get(key)!r}, the new ones {new_meta.get(key)!r}: they are not one study's "
                             "runs (write the new ones as another study, or rerun every row)")
    ran = {(r["variant"], r["seed"]) for r in new_records}
    records = [*new_records, *(r for r in old_records if (r["variant"], r["seed"]) not in ran)]
    rows = {**new_meta["rows"], **{n: r for n, r in old_meta["rows"].items() if n not in new_meta["rows"]}}
    provenance = {}
    for name in rows:
        by_seed = {s: p for s, p in old_meta.get("provenance", {}).get(name, {}).items() if (name, int(s)) not in ran}
        by_seed.update(new_meta.get("provenance", {}).get(name, {}))
        if by_seed:
            provenance[name] = dict(sorted(by_seed.items(), key=lambda item: int(item[0])))
    meta = {k: v for k, v in new_meta.items() if k != "provenance"}
    return records, {**meta, "rows": rows, **({"provenance": provenance} if provenance else {})}


def window_words(train_window: int | None, seq_len: int, eval_window: int | None = None) -> str:
    """A row's attention window in words: ``"L = 64"`` (the training length), ``"32"``, ``"whole
    past"``; a test-time window other than the trained one is added (``"…; at test: whole past"``).

    Args:
        train_window: the trained model's ``attention_window`` (None or 0: the whole past).
        seq_len: the training length L.
        eval_window: the sweep's eval option ``window`` (None: as trained; 0: the whole past).
    """
    def words(w: int | None) -> str:
        return "whole past" if not w else (f"L = {w}" if w == seq_len else str(w))

    text = words(train_window)
    if eval_window is not None and (eval_window or None) != (train_window or None):
        text += f"; at test: {words(eval_window)}"
    return text


def _sweep_meta(plan, *, study: str, corpus: str, command: str) -> dict:
    from spe.lab.music.config import resolve_model_options

    rows = {}
    for name, spec in plan.rows.items():
        train = plan.rows[spec["of"] or name]["train"]
        resolved = resolve_model_options(train["model"], train["seq_len"])
        blocks = resolved.get("attention_blocks")
        rows[name] = {"description": spec["description"],
                      "window": (f"blocks of {blocks}: own and previous" if blocks else
                                 window_words(resolved.get("attention_window"), train["seq_len"],
                                              spec["eval"].get("window")))}
    first = next(iter(plan.rows.values()))["train"]
    return {"study": study, "title": plan.title, "command": command, "corpus_or_task": corpus,
            "metric": "cross_entropy", "train_length": first["seq_len"], "plan": Path(plan.path).stem,
            "steps": first["steps"], "rows": rows}


def _counts(plan, name: str, seed: int, out: Path, record: dict) -> tuple[int, int]:
    """(train_tokens, params) of a run: its record's, else from its plan and checkpoint (records
    written before the sweep stored them)."""
    if "train_tokens" in record and "params" in record:
        return record["train_tokens"], record["params"]
    from spe.checkpoint import load
    from spe.lab.music.plan import variant_config

    cfg = variant_config(plan, name, seed, out)
    loaded = load(cfg.out)
    return record["step"] * cfg.batch_size * cfg.seq_len, sum(p.numel() for p in loaded.model.parameters())


def sweep_study(plan, out: str | Path, *, study: str, corpus: str, command: str) -> tuple[list[dict], dict]:
    """(records, meta) of every finished run of a ``spe sweep`` folder.

    Args:
        plan: the sweep's plan (:func:`spe.lab.plans.load_plan`, task ``music``).
        out: the sweep folder (``OUT/VARIANT/seedS/result.json``).
        study, corpus, command: the study's name, its corpus and the command that made the runs.

    Returns:
        One cross-entropy record per (variant, seed, split, bucket): the eval split's buckets
        (``test``, or ``validation`` where the plan evaluates that) and, where the record
        holds them, the validation buckets; and the meta (module docstring).

    Raises:
        ValueError: if no run of the plan is finished under ``out``.
    """
    out, records = Path(out), []
    for name, by_seed in plans.collect(plan, out).items():
        for seed, result in by_seed.items():
            _require(result, ("buckets", *(() if "params" in result else ("step",))),
                     plans.run_folder(out, name, seed) / plans.RESULT_FILE)
            tokens, params = _counts(plan, name, seed, out, result)
            splits = {result.get("eval", {}).get("split") or "validation": result["buckets"]}
            if result.get("validation"):
                splits["validation"] = result["validation"]["buckets"]
            for split, buckets in splits.items():
                records += [{"study": study, "corpus_or_task": corpus, "variant": name, "seed": seed,
                             "split": split, "bucket_start": b["start"], "bucket_end": b["end"],
                             "value": math.nan if b["ce"] is None else b["ce"], "metric": "cross_entropy",
                             "train_tokens": tokens, "params": params} for b in buckets]
    if not records:
        raise ValueError(f"no finished run of {plan.where()} under {out}")
    return records, _with_provenance(_sweep_meta(plan, study=study, corpus=corpus, command=command),
                                     plans.collect(plan, out))


def synth_study(results: Iterable[dict], *, study: str, title: str, command: str,
                rows: dict[str, dict] | None = None) -> tuple[list[dict], dict]:
    """(records, meta) of synthetic-task runs (``spe synth``), one accuracy record per
    (variant, seed, split, evaluated length).

    Each run's result is a dict with ``task`` (``flip-flop``, ``mqar``), ``variant``, ``seed``,
    ``train_length``, ``train_tokens``, ``params`` and ``results``: a list of
    ``{"split": "validation" | "test" | …, "length": N, "accuracy": a}`` (a in [0, 1]; N the
    evaluated sequence length, written as bucket_start = bucket_end = N).

    Args:
        results: the runs' results.
        study, title, command: the study's name, title and the command that made the runs.
        rows: row -> ``{"description", "window"}`` for the tables (default: the row's name, no window).

    Raises:
        ValueError: on runs of several tasks or training lengths, or none; KeyError on a missing key.
    """
    results = list(results)
    tasks, lengths = {r["task"] for r in results}, {r["train_length"] for r in results}
    if len(tasks) != 1 or len(lengths) != 1:
        raise ValueError(f"a study holds one task at one training length; got tasks {sorted(tasks)}, "
                         f"training lengths {sorted(lengths)}")
    records = [{"study": study, "corpus_or_task": r["task"], "variant": r["variant"], "seed": r["seed"],
                "split": e["split"], "bucket_start": e["length"], "bucket_end": e["length"],
                "value": e["accuracy"], "metric": "accuracy", "train_tokens": r["train_tokens"], "params": r["params"]}
               for r in results for e in r["results"]]
    names = list(dict.fromkeys(r["variant"] for r in results))
    rows = {n: (rows or {}).get(n, {"description": n, "window": ""}) for n in names}
    by_row: dict[str, dict[int, dict]] = {}
    for r in results:
        by_row.setdefault(r["variant"], {})[r["seed"]] = r
    return records, _with_provenance({"study": study, "title": title, "command": command,
                                      "corpus_or_task": tasks.pop(), "metric": "accuracy",
                                      "train_length": lengths.pop(), "rows": rows}, by_row)


def _require(record: object, keys: tuple[str, ...], file: Path) -> None:
    """Refuses a run's file that lacks ``keys`` (hand-edited, or of another tool), naming it."""
    missing = [k for k in keys if not isinstance(record, dict) or k not in record]
    if missing:
        raise ValueError(f"{file} has no {', '.join(missing)}: a study needs it for every run (run it again, "
                         "or remove the file)")


def synth_folder_results(out: str | Path, *,
                         descriptions: dict[str, str] | None = None) -> tuple[list[dict], dict]:
    """The runs of a ``spe synth --plan`` folder in :func:`synth_study`'s input, and its rows' meta.

    The folder holds one experiment per row, ``OUT/ROW/config.json`` (the row's options:
    ``task``, ``seq_len``, ``model`` with its resolved ``attention_window``) and
    ``OUT/ROW/seedK/result.json`` per finished seed (``seed``, ``train_tokens``, ``params``,
    ``val_accuracy``: the validation split at the training length, ``validation``: length ->
    ``{"accuracy", ...}`` beyond it (absent in results older than it), and ``test``:
    distribution -> length -> ``{"accuracy", ...}``). Both validation sources become split
    ``validation`` (at L and at the other lengths), each test distribution split
    ``test-DISTRIBUTION``; a length without targets (accuracy null) is left out.

    Args:
        out: the plan's folder.
        descriptions: row -> description (default: the row's name).

    Returns:
        (runs, rows): the runs, and row -> ``{"description", "window"}``.

    Raises:
        ValueError: naming the file, on a ``config.json`` without ``task`` or ``seq_len`` (or its old
            name ``train_length``) or a ``result.json`` without ``train_tokens`` or ``params``.
    """
    from spe.lab.synth.config import OLD_NAMES  # the training length, seq_len, was train_length

    runs, rows = [], {}
    for config_file in sorted(Path(out).glob("*/config.json")):
        row = config_file.parent.name
        config = rename_old_names(read_json_object(config_file, "an spe synth experiment's config"), OLD_NAMES)
        _require(config, ("task", "seq_len"), config_file)
        length = config["seq_len"]
        rows[row] = {"description": (descriptions or {}).get(row, row),
                     "window": window_words(config.get("model", {}).get("attention_window"), length)}
        for seed, result in plans.read_results(config_file.parent).items():
            _require(result, ("train_tokens", "params"), plans.run_folder(out, row, seed) / plans.RESULT_FILE)
            cells = [{"split": "validation", "length": length, "accuracy": result.get("val_accuracy")}]
            cells += [{"split": "validation", "length": int(n), "accuracy": cell.get("accuracy")}
                      for n, cell in result.get("validation", {}).items() if int(n) != length]
            cells += [{"split": f"test-{dist}", "length": int(n), "accuracy": cell.get("accuracy")}
                      for dist, by_length in result.get("test", {}).items() for n, cell in by_length.items()]
            runs.append({"task": config["task"], "variant": row, "seed": seed, "train_length": length,
                         "train_tokens": result["train_tokens"], "params": result["params"],
                         "results": [c for c in cells if c["accuracy"] is not None],
                         **({"provenance": result["provenance"]} if "provenance" in result else {})})
    return runs, rows


def lra_folder_results(out: str | Path) -> tuple[list[dict], dict]:
    """The runs of a folder of ``spe lra`` experiments of one task, in :func:`synth_study`'s input.

    ``out`` holds one experiment per row, ``OUT/ROW`` (``spe lra ... --out OUT/ROW``): its
    ``config.json`` (``task``, ``seq_len``, ``steps``, ``batch_size``, ``attention``, ``positional``)
    and ``seedK/result.json`` per finished seed (``val_accuracy`` of the best validation checkpoint,
    ``test_accuracy`` of that checkpoint, ``num_parameters``). Each seed becomes split ``validation``
    and split ``test`` at the training length (``bucket_start = bucket_end = seq_len``);
    ``train_tokens`` is steps × batch × seq_len (Retrieval's pairs count one document's length).

    Returns:
        (runs, rows): the runs, and row -> ``{"description": "ATTENTION + POSITIONAL", "window"}``.

    Raises:
        ValueError: naming the file, on a ``config.json`` without ``task`` or ``seq_len`` or a
            ``result.json`` without ``val_accuracy``, ``test_accuracy`` or ``num_parameters``.
    """
    from spe.lab.lra.config import OLD_NAMES  # the training length, seq_len, was max_length

    runs, rows = [], {}
    for config_file in sorted(Path(out).glob("*/config.json")):
        row = config_file.parent.name
        config = rename_old_names(read_json_object(config_file, "an spe lra experiment's config"), OLD_NAMES)
        _require(config, ("task", "seq_len", "steps", "batch_size"), config_file)
        # ListOps' sequences have no fixed length: the longest its generator draws stands for it
        length = config["seq_len"] or (config.get("data_options") or {}).get("max_length")
        if not isinstance(length, int):
            raise ValueError(f"{config_file}: seq_len is {config['seq_len']!r} and data_options has no max_length; "
                             "a study needs the run's training length")
        model = config.get("model", {})
        rows[row] = {"description": f"{config.get('attention')} + {config.get('positional')}",
                     "window": (f"blocks of {model['attention_blocks']}: own and previous"
                                if model.get("attention_blocks") else "whole input")}
        for seed, result in plans.read_results(config_file.parent).items():
            _require(result, ("val_accuracy", "test_accuracy", "num_parameters"),
                     plans.run_folder(out, row, seed) / plans.RESULT_FILE)
            runs.append({"task": config["task"], "variant": row, "seed": seed, "train_length": length,
                         "train_tokens": config["steps"] * config["batch_size"] * length,
                         "params": result["num_parameters"],
                         "results": [{"split": "validation", "length": length, "accuracy": result["val_accuracy"]},
                                     {"split": "test", "length": length, "accuracy": result["test_accuracy"]}],
                         **({"provenance": result["provenance"]} if "provenance" in result else {})})
    return runs, rows
