"""A study's committed data (spe.lab.study_data) and the tables generated from it alone
(spe.lab.study_tables, tools/docs/study_tables.py); every committed table equals its data."""

import importlib.util
import json
import math
from pathlib import Path

import pytest
from conftest import shifted_to_p

from spe.lab.study_data import FIELDS, check_record, read_study, sweep_study, synth_folder_results, synth_study, \
    write_study
from spe.lab.study_tables import PANEL_ROWS, drifted_blocks, line_style, panel_groups, plot_study, render_study, \
    replace_blocks, study_blocks

ROOT = Path(__file__).resolve().parents[2]
# per-seed validation values of three rows (the rules' hand-computed case, tests/lab/test_study_rules.py)
VALIDATION = {"a": [1.0, 1.1, 1.2], "b": [1.1, 1.2, 1.3], "c": [2.0, 2.1, 2.2]}


def _tool():
    spec = importlib.util.spec_from_file_location("study_tables_tool", ROOT / "tools" / "docs" / "study_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _records(study="t", length=8, scale_last=1.1, test_shift=0.5, validation=None):
    """16 buckets of L = 8 on validation and test (row -> per-seed values, :data:`VALIDATION` by
    default); the last bucket is scale_last × the first per seed."""
    out = []
    for split, shift in (("validation", 0.0), ("test", test_shift)):
        for row, values in (validation or VALIDATION).items():
            for seed, v in enumerate(values):
                for k in range(16):
                    value = (v + shift) * (scale_last if k == 15 else 1.0)
                    out.append({"study": study, "corpus_or_task": "toy", "variant": row, "seed": seed, "split": split,
                                "bucket_start": k * length, "bucket_end": (k + 1) * length, "value": value,
                                "metric": "cross_entropy", "train_tokens": 32, "params": 2_500_000})
    return out


def _meta(study="t", rows=("c", "b", "a")):
    return {"study": study, "title": "Toy", "command": "spe sweep --plan toy --out runs/toy", "corpus_or_task": "toy",
            "metric": "cross_entropy", "train_length": 8, "plan": "toy", "steps": 500,
            "rows": {r: {"description": f"row {r}", "window": "whole past"} for r in rows}}


def _line(text, start):
    return next(line for line in text.splitlines() if line.startswith(start))


def test_the_validation_table_selects_and_the_test_table_only_reports():
    text = render_study(_records(), _meta())
    header = _line(text, "| row | window")
    assert header == ("| row | window | seeds | params | [0,8) | p (Holm) | [24,32) | [120,128) | p (Holm) | growth "
                      "| 5 seeds | description |")
    # sorted by the last bucket; the best group in bold where it is tested (first and last bucket);
    # b near the threshold (see the rules' test), so the best runs 5 seeds too; growth = 1.1 − 1 in
    # every seed; c far out
    a, b, c = (_line(text, f"| {r} | whole past") for r in "abc")
    assert text.index(a) < text.index(b) < text.index(c)
    assert a == ("| a | whole past | 3 | 2.50 M | **1.100 ± 0.100** | best | 1.100 ± 0.100 | **1.210 ± 0.110** "
                 "| best | +10.0 ± 0.0 % | [0,8), [120,128) | row a |")
    assert b.startswith("| b | whole past | 3 | 2.50 M | **1.200 ± 0.100** | 0.144 |")
    assert "| 2.100 ± 0.100 | <0.001 |" in c and "**" not in c and c.endswith("| +10.0 ± 0.0 % |  | row c |")
    test = text[text.index("Test split"):]
    assert "**" not in test.split("* Best")[0] and "| p" not in test
    assert "| a | 3 | 1.600 ± 0.100 | 1.600 ± 0.100 | 1.760 ± 0.110 | +10.0 ± 0.0 % |" in test
    assert "* Best group on validation at [0,8), Holm over 2 tests: a, b (best a: 1.100 ± 0.100); stable" in text
    assert "* Rows to run at 5 seeds: b, a." in text or "* Rows to run at 5 seeds: a, b." in text
    assert "* Training tokens per run: 32." in text
    # a row of the plan without runs is left out
    assert "| z |" not in render_study(_records(), {**_meta(), "rows": {**_meta()["rows"], "z": {}}})


def test_selection_ignores_the_test_split():
    # a test split that reverses the order changes no mark, p-value or order of the validation table
    flipped = [dict(r, value=10 - r["value"]) if r["split"] == "test" else r for r in _records()]
    ours, theirs = render_study(_records(), _meta()), render_study(flipped, _meta())
    assert ours.split("Test split")[0] == theirs.split("Test split")[0]
    with pytest.raises(ValueError, match="holds no validation split"):
        render_study([r for r in _records() if r["split"] == "test"], _meta())


def test_the_data_round_trips_and_a_table_drifts_when_a_value_changes(tmp_path):
    jsonl, _ = write_study(tmp_path / "data", _records(), _meta())
    first = json.loads(jsonl.read_text().splitlines()[0])
    assert tuple(first) == FIELDS  # exactly the fields, in order
    records, meta = read_study(tmp_path / "data", "t")
    assert meta == _meta() and sorted(map(str, records)) == sorted(map(str, _records()))
    doc = tmp_path / "doc.md"
    doc.write_text("prose\n<!-- table:t -->\nold\n<!-- /table -->\nmore prose\n")

    def render(name, where):
        return render_study(*read_study(tmp_path / "data", name))

    assert drifted_blocks(doc, render) == ["t"]
    doc.write_text(replace_blocks(doc.read_text(), {"t": render("t", doc)}))
    assert drifted_blocks(doc, render) == [] and doc.read_text().endswith("<!-- /table -->\nmore prose\n")
    changed = jsonl.read_text().replace('"value": 1.1,', '"value": 1.15,', 1)
    assert changed != jsonl.read_text()
    jsonl.write_text(changed)
    assert drifted_blocks(doc, render) == ["t"]


def test_every_committed_table_equals_its_data():
    """The docs cannot drift from docs/data: each <!-- table:STUDY --> block is what the generator
    writes from docs/data/STUDY.jsonl alone, and every study there is shown by a doc."""
    tool = _tool()
    docs = tool.docs_with_blocks()
    assert docs, "no doc holds a study block (docs/study-rules.md holds the worked example)"
    for doc in docs:
        assert drifted_blocks(doc, tool.render) == [], f"{doc}: run python tools/docs/study_tables.py"
    assert tool.unshown_studies() == []


def test_one_experiment_run_twice_on_one_commit_and_machine_gives_the_same_cells_in_every_study():
    """Two committed runs with one experiment hash (the same experiment and seed, asked for by two
    plans: the rows gates-bach shares with learned-time-bach) that ran on one commit, torch, CPU
    model and instruction sets, device and thread count are one deterministic training run twice: their common cells
    must be bit-identical, or a record is not what its provenance says."""
    data = ROOT / "docs" / "data"
    runs = {}
    for meta_path in sorted(data.glob("*.meta.json")):
        records, meta = read_study(data, meta_path.name[: -len(".meta.json")])
        for row, seeds in (meta.get("provenance") or {}).items():
            for seed, p in seeds.items():
                if not p.get("experiment_sha256"):
                    continue
                key = tuple(json.dumps(p.get(k), sort_keys=True) for k in (
                    "experiment_sha256", "commit", "torch", "cpu", "cpu_isa", "isa_limits", "device", "threads"))
                cells = {(r["split"], r["bucket_start"], r["bucket_end"]): r["value"] for r in records
                         if r["variant"] == row and r["seed"] == int(seed)}
                runs.setdefault(key, []).append((meta["study"], row, seed, cells))
    twice = [found for found in runs.values() if len(found) > 1]
    assert len(twice) >= 15, "gates-bach shares 5 rows x 3 seeds with learned-time-bach"
    for (study, row, seed, cells), *others in twice:
        for other_study, other_row, _, other_cells in others:
            common = cells.keys() & other_cells.keys()
            assert common, (study, other_study)
            differ = [k for k in sorted(common) if cells[k] != other_cells[k]]
            assert not differ, f"{study} {row} and {other_study} {other_row}, seed {seed}: {differ[:3]}"


def test_records_are_refused_unless_they_have_exactly_the_fields():
    good = _records()[0]
    assert check_record(dict(good, value=None))["value"] != check_record(dict(good, value=None))["value"]  # NaN
    with pytest.raises(ValueError, match=r"unknown \['std'\]"):
        check_record({**good, "std": 0.1})
    with pytest.raises(ValueError, match="metric must be one of cross_entropy, accuracy"):
        check_record({**good, "metric": "bleu"})
    with pytest.raises(ValueError, match="bucket_end 0 < bucket_start 8"):
        check_record({**good, "bucket_start": 8, "bucket_end": 0})
    with pytest.raises(ValueError, match="seed must be an integer"):
        check_record({**good, "seed": "0"})


def _run(variant, seed, ce, validation=True):
    buckets = [{"start": 64 * k, "end": 64 * k + 64, "ce": ce + k / 100} for k in range(16)]
    record = {"variant": variant, "seed": seed, "step": 500, "eval": {"split": "test", "bucket_width": 64},
              "buckets": buckets, "params": 3_000_000, "train_tokens": 256_000}
    if validation:
        record["validation"] = {"max_length": 640, "num_sequences": 12, "buckets": buckets[:10]}
    return record


def test_a_sweep_folder_becomes_records_of_both_splits(tmp_path):
    from spe.lab.plans import load_plan
    from spe.lab.plans import write_result

    plan = load_plan("learned-time", "music")
    write_result(tmp_path / "ape" / "seed0", _run("ape", 0, 1.0))
    write_result(tmp_path / "sinespe-gated-whole" / "seed1", _run("sinespe-gated-whole", 1, 0.9))
    records, meta = sweep_study(plan, tmp_path, study="lt", corpus="Bach chorales", command="spe sweep --plan x")
    assert len(records) == 2 * (16 + 10)
    assert {(r["variant"], r["split"]) for r in records} == {(v, s) for v in ("ape", "sinespe-gated-whole")
                                                            for s in ("test", "validation")}
    last = max((r for r in records if r["split"] == "test" and r["variant"] == "ape"), key=lambda r: r["bucket_start"])
    assert (last["bucket_start"], last["bucket_end"], last["value"]) == (960, 1024, pytest.approx(1.15))
    assert all(r["train_tokens"] == 256_000 and r["params"] == 3_000_000 for r in records)
    assert meta["rows"]["sinespe"]["window"] == "L = 64" and meta["rows"]["sinespe-gated-whole"]["window"] == "whole past"
    assert (meta["plan"], meta["steps"], meta["train_length"]) == ("learned-time", 500, 64)
    with pytest.raises(ValueError, match="no finished run"):
        sweep_study(plan, tmp_path / "empty", study="lt", corpus="x", command="x")


def test_the_written_command_names_the_rows_and_steps_that_ran_so_reproduce_reruns_them(tmp_path):
    from spe.lab.plans import load_plan, write_result

    tool = _tool()
    runs = tmp_path / "runs"
    write_result(runs / "fox" / "seed0", _run("fox", 0, 1.0))
    write_result(runs / "path-fox" / "seed0", _run("path-fox", 0, 0.9))
    assert tool.main(["write", "--plan", "learned-time", "--runs", str(runs), "--study", "lt8", "--corpus", "Bach",
                      "--steps", "4000", "--data-dir", str(tmp_path / "data"), "--allow-dirty"]) == 0
    _, meta = read_study(tmp_path / "data", "lt8")
    words = meta["command"].split()
    assert words[words.index("--steps") + 1] == "4000" and meta["steps"] == 4000
    assert sorted(words[words.index("--only") + 1].split(",")) == ["fox", "path-fox"] == sorted(meta["rows"])
    rerun = tool.reproduction_command(meta, "fox", 0, "out", 1)
    assert rerun[rerun.index("--steps") + 1] == "4000" and rerun[rerun.index("--only") + 1] == "fox"
    # the whole plan run at its own steps: no --only, no --steps
    for name in load_plan("learned-time", "music").rows:
        write_result(runs / name / "seed0", _run(name, 0, 1.0))
    assert tool.main(["write", "--plan", "learned-time", "--runs", str(runs), "--study", "lt", "--corpus", "Bach",
                      "--data-dir", str(tmp_path / "data"), "--allow-dirty"]) == 0
    _, meta = read_study(tmp_path / "data", "lt")
    assert meta["command"] == f"spe sweep --plan learned-time --out {runs}"


def test_rows_another_plan_ran_as_the_same_experiments_serve_a_second_study(tmp_path, capsys):
    """--rows-from: the rows the sweep folder lacks come from another plan's folder, each run checked
    to be this plan's experiment (its experiment_sha256), never a look-alike."""
    from spe.lab.music.plan import MusicPlans
    from spe.lab.plans import load_plan, write_result
    from spe.lab.provenance import experiment_hash, provenance

    tool = _tool()
    gates = load_plan("gates-palestrina", "music")
    here, other = tmp_path / "gates", tmp_path / "learned-time"

    def run(folder, plan, name, seed, ce, data="music21:palestrina/2", steps=None):
        config = MusicPlans(plan, folder, progress=False, data=data, steps=steps).config(name, seed)
        write_result(folder / name / f"seed{seed}",
                     {**_run(name, seed, ce), "provenance": provenance(started=0.0, ended=1.0, config=config)})

    run(here, gates, "decay", 0, 1.0)
    lt = load_plan("learned-time-palestrina", "music")
    run(other, lt, "fox", 0, 0.8)
    run(other, lt, "path-fox", 0, 0.7)  # not a row of the gates plan: never taken
    argv = ["write", "--plan", "gates-palestrina", "--runs", str(here), "--study", "gp", "--corpus", "P",
            "--data", "music21:palestrina/2", "--data-dir", str(tmp_path / "data"), "--allow-dirty"]
    assert tool.main([*argv, "--rows-from", str(other)]) == 0
    records, meta = read_study(tmp_path / "data", "gp")
    assert {r["variant"] for r in records} == {"decay", "fox"} and set(meta["provenance"]) == {"decay", "fox"}
    assert meta["command"].endswith(f"# fox: the runs of {other} (the same experiments)")
    assert tool.reproduction_command(meta, "fox", 0, "o", 1)[:4] == ["sweep", "--plan", "gates-palestrina", "--data"]
    # the same row name run on other data is another experiment: refused, naming row, seed and hashes
    run(other, lt, "fox", 0, 0.8, data="music21:palestrina/4")
    wanted = experiment_hash(MusicPlans(gates, here, progress=False, data="music21:palestrina/2").config("fox", 0))
    capsys.readouterr()
    assert tool.main([*argv, "--study", "gp2", "--rows-from", str(other)]) == 2
    said = capsys.readouterr().err
    assert "fox seed 0 is not plan 'gates-palestrina''s experiment" in said and wanted in said
    assert not (tmp_path / "data" / "gp2.jsonl").exists()
    # runs at a longer budget are this plan's experiment at that budget (--steps), not at the plan's own
    longer = tmp_path / "longer"
    run(longer, lt, "fox", 0, 0.6, steps=2000)
    assert tool.main([*argv, "--study", "gp4", "--steps", "2000", "--rows-from", str(longer)]) == 0
    assert tool.main([*argv, "--study", "gp5", "--rows-from", str(longer)]) == 2
    # nothing to take
    (tmp_path / "empty").mkdir()
    assert tool.main([*argv, "--study", "gp3", "--rows-from", str(tmp_path / "empty")]) == 2
    assert "no finished run" in capsys.readouterr().err
    # the other plan's runs once committed (their folder gone): taken from the study, hash checked
    run(other, lt, "fox", 0, 0.8)
    assert tool.main(["write", "--plan", "learned-time-palestrina", "--runs", str(other), "--study", "ltp",
                      "--corpus", "P", "--data-dir", str(tmp_path / "data"), "--allow-dirty"]) == 0
    assert tool.main([*argv, "--study", "gp6", "--rows-from", "ltp"]) == 0
    records, meta = read_study(tmp_path / "data", "gp6")
    assert {r["variant"] for r in records} == {"decay", "fox"} and {r["study"] for r in records} == {"gp6"}
    assert meta["command"].endswith("# fox: the runs of the committed study ltp (the same experiments)")
    assert meta["provenance"]["fox"]["0"]["experiment_sha256"] == wanted
    assert tool.main([*argv, "--study", "gp7", "--steps", "2000", "--rows-from", "ltp"]) == 2
    assert "fox seed 0 is not plan 'gates-palestrina''s experiment" in capsys.readouterr().err
    assert tool.main([*argv, "--study", "gp8", "--rows-from", "no-such-study"]) == 2
    assert "neither a sweep folder nor a study" in capsys.readouterr().err


def _provenance(meta, commit, rows_seeds):
    return {**meta, "provenance": {row: {str(s): {"commit": commit, "dirty": False} for s in seeds}
                                   for row, seeds in rows_seeds.items()}}


def test_a_study_rerun_part_by_part_keeps_the_committed_runs_the_new_ones_lack():
    from spe.lab.study_data import merge_study

    old = (_records(), _provenance(_meta(), "old", {"a": [0, 1, 2], "b": [0, 1, 2], "c": [0, 1, 2]}))
    # rows a (seeds 0-2) and b (seed 1 only) rerun on another commit, with other values
    new_values = {"a": [5.0, 5.1, 5.2], "b": [6.0]}
    new_records = [r for r in _records(validation=new_values) if not (r["variant"] == "b" and r["seed"] != 0)]
    for r in new_records:
        if r["variant"] == "b":
            r["seed"] = 1
    new = (new_records, _provenance(_meta(rows=("a", "b")), "new", {"a": [0, 1, 2], "b": [1]}))
    records, meta = merge_study(old, new)
    value = {(r["variant"], r["seed"], r["split"], r["bucket_start"]): r["value"] for r in records}
    assert len(value) == len(records) == len(old[0])  # every (row, seed, split, bucket) once
    assert value["a", 2, "validation", 0] == 5.2 and value["b", 1, "validation", 0] == 6.0  # replaced
    assert value["b", 0, "validation", 0] == 1.1 and value["c", 2, "validation", 0] == 2.2  # kept
    assert list(meta["rows"]) == ["a", "b", "c"]  # the new part's rows first, then the kept ones
    commits = {row: {s: p["commit"] for s, p in by_seed.items()} for row, by_seed in meta["provenance"].items()}
    assert commits == {"a": {"0": "new", "1": "new", "2": "new"}, "b": {"0": "old", "1": "new", "2": "old"},
                       "c": {"0": "old", "1": "old", "2": "old"}}
    # the table flags b, whose seeds now span two commits, and only b
    assert _line(render_study(records, meta), "| b †").startswith("| b †")
    assert "| a †" not in render_study(records, meta) and "| c †" not in render_study(records, meta)
    for key, other in (("steps", 4000), ("train_length", 64), ("corpus_or_task", "Palestrina"), ("study", "u")):
        with pytest.raises(ValueError, match=rf"{key} .*not one study's runs"):
            merge_study(old, (new[0], {**new[1], key: other}))


def test_write_merge_keeps_the_committed_rows_and_refuses_without_a_committed_study(tmp_path, capsys):
    from spe.lab.plans import write_result

    tool, data = _tool(), tmp_path / "data"
    first, second = tmp_path / "first", tmp_path / "second"
    write_result(first / "fox" / "seed0", _run("fox", 0, 1.0))
    write_result(first / "path-fox" / "seed0", _run("path-fox", 0, 0.9))
    write_result(second / "fox" / "seed0", _run("fox", 0, 0.5))
    write_result(second / "fox" / "seed1", _run("fox", 1, 0.6))
    args = ["--plan", "learned-time", "--study", "lt", "--corpus", "Bach", "--data-dir", str(data), "--allow-dirty"]
    assert tool.main(["write", "--runs", str(second), "--merge", *args]) == 2
    assert "nothing to merge with" in capsys.readouterr().err and not data.exists()
    assert tool.main(["write", "--runs", str(first), *args]) == 0
    assert tool.main(["write", "--runs", str(second), "--merge", *args]) == 0
    assert "kept 1 committed run(s) that these 2 do not replace" in capsys.readouterr().out
    records, _ = read_study(data, "lt")
    first_test = {(r["variant"], r["seed"]): r["value"] for r in records if r["split"] == "test" and r["bucket_start"] == 0}
    assert first_test == {("fox", 0): 0.5, ("fox", 1): 0.6, ("path-fox", 0): 0.9}


def test_synthetic_results_become_accuracy_records_at_each_length():
    results = [{"task": "mqar", "variant": v, "seed": s, "train_length": 64, "train_tokens": 10, "params": 5,
                "results": [{"split": "validation", "length": n, "accuracy": acc - 0.1 * (n > 64) + 0.01 * s}
                            for n in (64, 256, 1024, 4096, 8192)]}
               for v, acc in (("x", 0.9), ("y", 0.5)) for s in range(3)]
    records, meta = synth_study(results, study="mqar", title="MQAR", command="spe synth --task mqar")
    assert {(r["bucket_start"], r["bucket_end"]) for r in records} == {(n, n) for n in (64, 256, 1024, 4096, 8192)}
    assert meta["metric"] == "accuracy" and meta["train_length"] == 64
    text = render_study(records, meta)
    # L, 4 L, 16 L, 64 L, then the longest length held (8192 = 128 L), in percent; higher is better
    assert _line(text, "| row").startswith("| row | window | seeds | params | N = 64 % | p (Holm) | N = 256 % "
                                           "| N = 1,024 % | N = 4,096 % | N = 8,192 % | p (Holm) | 5 seeds |")
    assert _line(text, "| x ").startswith("| x |  | 3 | 0.00 M | **91.0 ± 1.0** | best |")
    with pytest.raises(ValueError, match="one task at one training length"):
        synth_study([*results, {**results[0], "task": "flip-flop"}], study="s", title="t", command="c")


def test_seventeen_rows_get_seventeen_looks_and_the_plot_is_written(tmp_path):
    looks = [line_style(i) for i in range(17)]
    assert len(set(looks)) == 17 and len({c for c, _, _ in looks}) == 17  # a colour each, and a style beside
    plot_study(_records(), _meta(), tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_the_longer_budget_command_repeats_the_four_best_validation_rows_at_4x_the_steps():
    tool = _tool()
    records = _records() + [dict(r, variant="d", value=r["value"] + 0.05) for r in _records() if r["variant"] == "a"]
    meta = _meta()
    meta["command"] = "spe sweep --plan toy --out runs/toy --data music21:palestrina/2"
    assert tool.four_best_command(records, meta, k=2) == (
        "spe sweep --plan toy --only a,d --steps 2000 --out runs/toy-4x --data music21:palestrina/2")
    # a note after the command, as the committed studies record (an apostrophe in it is prose)
    meta["command"] += "   # runners side by side; then the rule's repeats"
    assert tool.four_best_command(records, meta, k=2).endswith("--out runs/toy-4x --data music21:palestrina/2")


def test_blocks_are_found_by_name():
    text = "x\n<!-- table:one -->\nA\n<!-- /table -->\n<!-- table:two-2 -->\nB\n<!-- /table -->\n"
    assert study_blocks(text) == {"one": "A\n", "two-2": "B\n"}
    assert study_blocks(replace_blocks(text, {"two-2": "C\n"})) == {"one": "A\n", "two-2": "C\n"}
    assert math.isnan(check_record({**_records()[0], "value": None})["value"])


def test_a_synth_plan_folder_becomes_validation_at_l_and_a_test_split_per_distribution(tmp_path):
    """The layout of ``spe synth --plan``: OUT/ROW/config.json, OUT/ROW/seedK/result.json with the
    validation accuracy at L and test accuracies per distribution and length."""
    from spe.lab.plans import write_result

    for row, window, acc in (("sinespe", 64, 0.9), ("fox", None, 0.99)):
        (tmp_path / row).mkdir()
        (tmp_path / row / "config.json").write_text(json.dumps(
            {"task": "flip-flop", "train_length": 64, "model": {"attention_window": window}}))
        for seed in (0, 1):
            test = {d: {str(n): {"accuracy": acc - n / 1e5 + seed / 100, "targets": 10} for n in (64, 256, 4096)}
                    for d in ("sparse", "dense")}
            test["dense"]["4096"]["accuracy"] = None  # no target drawn at that length: left out
            write_result(tmp_path / row / f"seed{seed}", {"task": "flip-flop", "seed": seed, "train_tokens": 99,
                                                           "params": 7, "val_accuracy": acc + seed / 100, "test": test})
    runs, rows = synth_folder_results(tmp_path, descriptions={"fox": "FoX"})
    assert rows == {"fox": {"description": "FoX", "window": "whole past"},
                    "sinespe": {"description": "sinespe", "window": "L = 64"}}
    records, meta = synth_study(runs, study="ff", title="Flip-flop", command="spe synth --plan x", rows=rows)
    splits = {(r["split"], r["bucket_start"]) for r in records}
    assert splits == {("validation", 64), *(("test-sparse", n) for n in (64, 256, 4096)),
                      ("test-dense", 64), ("test-dense", 256)}
    text = render_study(records, meta)
    assert _line(text, "| fox |").startswith("| fox | whole past | 2 | 0.00 M | **99.5 ± 0.7** | best |")
    assert "Test-sparse split (reported only" in text and "N = 4,096 %" in text


def test_validation_beyond_l_joins_the_validation_split_and_orders_rows_there(tmp_path):
    """A seed's ``validation`` cells (lengths beyond L) become split ``validation`` at those lengths,
    beside ``val_accuracy`` at L; a result from before them (no such key) adds none."""
    from spe.lab.plans import write_result

    for row, beyond in (("fox", {"256": 0.97, "4096": 0.91}), ("gated", {"256": 0.95, "4096": 0.70}), ("old", None)):
        (tmp_path / row).mkdir()
        (tmp_path / row / "config.json").write_text(json.dumps({"task": "flip-flop", "train_length": 64, "model": {}}))
        for seed in (0, 1):
            result = {"task": "flip-flop", "seed": seed, "train_tokens": 99, "params": 7, "val_accuracy": 1.0,
                      "test": {"sparse": {"4096": {"accuracy": 0.5, "targets": 10}}}}
            if beyond is not None:
                result["validation"] = {n: {"accuracy": a + seed / 100, "targets": 10} for n, a in beyond.items()}
            write_result(tmp_path / row / f"seed{seed}", result)
    runs, rows = synth_folder_results(tmp_path)
    records, meta = synth_study(runs, study="ff", title="Flip-flop", command="spe synth --plan x", rows=rows)
    validation = {(r["variant"], r["seed"], r["bucket_start"]): r["value"]
                  for r in records if r["split"] == "validation"}
    assert {k for k in validation if k[0] == "old"} == {("old", 0, 64), ("old", 1, 64)}
    assert validation[("gated", 1, 4096)] == 0.71 and validation[("fox", 0, 256)] == 0.97
    text = render_study(records, meta)
    # chosen on validation beyond L, not on test
    assert "* Best group on validation at N = 4,096, Holm over 1 test: fox" in text


def test_a_null_value_is_left_out_of_every_cell_and_counted(tmp_path):
    records = _records()
    nulled = next(i for i, r in enumerate(records) if (r["variant"], r["seed"], r["split"], r["bucket_start"])
                  == ("a", 1, "validation", 120))
    records[nulled] = {**records[nulled], "value": None}
    write_study(tmp_path / "data", records, _meta())
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- table:t -->\n<!-- /table -->\n")
    tool = _tool()
    text = tool.render("t", doc, data=tmp_path / "data", plots=tmp_path / "plots")
    assert "left out of every cell and test: 1 (a seed 1 validation [120,128))" in text
    row = _line(text, "| a |")
    assert row.endswith("| **1.210 ± 0.156** | best | +10.0 ± 0.0 % | [0,8) | row a |")  # seeds 0, 2: 1.1, 1.32
    assert "left out" not in render_study(_records(), _meta())
    plot_study(*read_study(tmp_path / "data", "t"), tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 0


def _write_lines(folder, lines, meta=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "t.jsonl").write_text("".join(lines))
    (folder / "t.meta.json").write_text(json.dumps(_meta() if meta is None else meta))


def _jsonl(records):
    return [json.dumps({k: r[k] for k in FIELDS}) + "\n" for r in records]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda lines, meta: (lines[:2] + [lines[1]], meta),
     r"t.jsonl:3: a second record of \(variant 'a', seed 0, split 'test', bucket_start 8, bucket_end 16\); "
     r"the first is at .*t.jsonl:2"),
    (lambda lines, meta: (lines[:1] + ["{not json\n"], meta), r"t.jsonl:2: not JSON"),
    (lambda lines, meta: (lines[:1] + ["[1, 2]\n"], meta), r"t.jsonl:2: a record must be a JSON object"),
    (lambda lines, meta: (lines, {k: v for k, v in meta.items() if k != "metric"}),
     r"t.meta.json: missing metric \(a study's meta holds"),
    (lambda lines, meta: (lines, {k: v for k, v in meta.items() if k != "rows"}), r"t.meta.json: missing rows"),
    (lambda lines, meta: (lines, {**meta, "rows": ["a"]}), r"t.meta.json: rows must map each row"),
])
def test_bad_study_files_are_refused_naming_the_file_and_line(tmp_path, edit, message):
    lines, meta = edit(_jsonl(sorted(_records(), key=lambda r: (r["variant"], r["seed"], r["split"],
                                                                   r["bucket_start"]))), _meta())
    _write_lines(tmp_path / "data", lines, meta)
    with pytest.raises(ValueError, match=message):
        read_study(tmp_path / "data", "t")


def test_the_tool_says_a_bad_study_file_in_one_line(tmp_path, capsys):
    tool = _tool()
    _write_lines(tmp_path, ["{not json\n"])
    tool.DATA = tmp_path  # four-best reads the data folder the tool was given
    assert tool.main(["four-best", "--study", "t"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "t.jsonl:1: not JSON" in err, err


def test_duplicated_records_are_refused_when_written_and_rendered(tmp_path):
    records = _records()
    with pytest.raises(ValueError, match=r"record 1: a second record of \(variant 'a', seed 0, split 'validation'"):
        write_study(tmp_path, [records[0], dict(records[0], value=9.0)], _meta())
    with pytest.raises(ValueError, match=r"two records of .* \('a', 0, 'validation', 0, 8\)"):
        render_study([*records, dict(records[0], value=9.0)], _meta())
    assert not list(tmp_path.iterdir())


def test_a_synth_result_without_params_is_named(tmp_path):
    (tmp_path / "ape" / "seed0").mkdir(parents=True)
    (tmp_path / "ape" / "config.json").write_text(json.dumps({"task": "mqar", "train_length": 64, "model": {}}))
    (tmp_path / "ape" / "seed0" / "result.json").write_text(json.dumps({"seed": 0, "train_tokens": 10, "test": {}}))
    with pytest.raises(ValueError, match=r"ape/seed0/result.json has no params"):
        synth_folder_results(tmp_path)
    (tmp_path / "ape" / "config.json").write_text(json.dumps({"task": "mqar"}))
    with pytest.raises(ValueError, match=r"ape/config.json has no seq_len"):
        synth_folder_results(tmp_path)


BACH_ROWS = ["ape", "sinespe", "gated", "gated-channel", "fox", "sinespe-whole", "sinespe-gated-whole",
             "sinespe-gated-channel-whole", "foxpro", "path", "path-fox", "rope-learned", "rope-learned-gated",
             "sinespe-onset", "sinespe-learned", "sinespe-learned-gated", "sinespe-learned-gated-channel",
             "sinespe-learned-linear-gated"]


def test_the_plot_groups_rows_by_family_at_most_six_a_panel():
    groups = panel_groups(BACH_ROWS)
    assert sorted(n for _, names in groups for n in names) == sorted(BACH_ROWS)  # each row once
    assert all(len(names) <= PANEL_ROWS for _, names in groups)
    families = dict(groups)
    assert families["PaTH and FoX"] == ["fox", "foxpro", "path", "path-fox"]
    assert families["sineSPE, ungated"] == ["sinespe", "sinespe-whole", "sinespe-onset", "sinespe-learned"]
    # a family longer than a panel is cut into parts, in order
    many = [f"sinespe-gated-{k}" for k in range(8)]
    assert panel_groups(many) == [("sineSPE under a gate (1/2)", many[:6]), ("sineSPE under a gate (2/2)", many[6:])]


def test_every_panel_draws_the_best_row_and_at_most_six_others(tmp_path):
    pytest.importorskip("matplotlib")
    names = ["ape", "fox", *(f"sinespe-gated-{k}" for k in range(7))]
    base = {name: 1.0 + 0.1 * i for i, name in enumerate(names)}  # fox the best after ape
    base["fox"] = 0.5
    records = [{**r, "variant": name, "value": r["value"] - 0.95 + base[name]}
               for name in names for r in _records() if r["variant"] == "a"]
    meta = {**_meta(), "rows": {n: {"description": n, "window": "whole past"} for n in names}}
    drawn = plot_study(records, meta, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    assert {family for family, _ in drawn} == {"APE and RoPE", "PaTH and FoX", "sineSPE under a gate (1/2)",
                                              "sineSPE under a gate (2/2)"}
    for (family, split), labels in drawn.items():
        rows = [label for label in labels if not label.startswith("best: ")]
        assert 1 <= len(rows) <= PANEL_ROWS, (family, split)
        assert "best: fox" in labels or "fox (best group)" in labels, (family, split)


def test_a_seed_is_rerun_with_its_studys_plan_data_and_steps_and_compared_bit_for_bit():
    tool = _tool()
    meta = {**_meta(), "command": "spe sweep --plan learned-time-palestrina --data music21:palestrina/2 --out "
                                  "runs/p --seeds 0,1,2 --threads 1   # two runners side by side", "steps": 500}
    assert tool.reproduction_command(meta, "b", 3, "runs/r", 1) == [
        "sweep", "--plan", "learned-time-palestrina", "--data", "music21:palestrina/2", "--steps", "500",
        "--only", "b", "--seeds", "3", "--out", "runs/r", "--threads", "1", "--no-progress"]
    synth = {**_meta(), "command": "spe synth --plan ff-quick --out runs/s --steps 1000 --seeds 0,1,2"}
    assert tool.reproduction_command(synth, "a", 0, "o", 2)[:4] == ["synth", "--plan", "ff-quick", "--steps"]
    with pytest.raises(ValueError, match="no row 'z'"):
        tool.reproduction_command(meta, "z", 0, "o", 1)
    with pytest.raises(ValueError, match="only an spe sweep, spe lra or spe synth --plan study"):
        tool.reproduction_command({**meta, "command": "scripts/lra_cpu_small.sh runs/lra"}, "a", 0, "o", 1)

    def cell(split, start, value):
        return {"split": split, "bucket_start": start, "bucket_end": start + 8, "value": value}

    committed = [cell("validation", 0, 1.25), cell("validation", 8, 1.5), cell("test", 0, 0.1 + 0.2)]
    same = tool.compare_cells(committed, [cell("test", 0, 0.30000000000000004), *committed[:2]])
    assert same == {"cells": 3, "missing": [], "differ": []}
    off = tool.compare_cells(committed, [cell("validation", 0, 1.25), cell("test", 0, 0.3)])
    assert off["missing"] == [("validation", 8, 16)] and off["differ"] == [(("test", 0, 8), 0.30000000000000004, 0.3)]


def test_a_local_attention_row_states_its_blocks_as_its_window(tmp_path):
    from spe.lab.plans import load_plan
    from spe.lab.plans import write_result

    write_result(tmp_path / "music-transformer" / "seed0", _run("music-transformer", 0, 1.0))
    _, meta = sweep_study(load_plan("tutorial", "music"), tmp_path, study="t", corpus="Bach chorales", command="c")
    assert meta["rows"]["music-transformer"]["window"] == "blocks of 32: own and previous"
    assert meta["rows"]["sinespe"]["window"] == "L = 64" and meta["rows"]["fnet-causal"]["window"] == "whole past"


def test_a_folder_of_lra_experiments_becomes_validation_and_test_accuracy_at_the_training_length(tmp_path):
    from spe.lab.plans import write_result
    from spe.lab.study_data import lra_folder_results

    for row, attention, acc in (("fnet-ape", "fnet", 0.3), ("softmax-ape", "softmax", 0.4)):
        (tmp_path / row).mkdir()
        (tmp_path / row / "config.json").write_text(json.dumps(
            {"task": "listops", "max_length": 300, "steps": 2000, "batch_size": 32, "attention": attention,
             "positional": "ape", "model": {}}))
        for seed in range(3):
            write_result(tmp_path / row / f"seed{seed}", {"val_accuracy": acc + seed / 100,
                                                          "test_accuracy": acc - 0.05, "num_parameters": 1000})
    runs, rows = lra_folder_results(tmp_path)
    assert rows["fnet-ape"] == {"description": "fnet + ape", "window": "whole input"}
    records, meta = synth_study(runs, study="lra-t", title="t", command="c", rows=rows)
    assert meta["train_length"] == 300 and {r["split"] for r in records} == {"validation", "test"}
    assert {r["train_tokens"] for r in records} == {2000 * 32 * 300}
    text = render_study(records, meta)
    assert _line(text, "| softmax-ape ").startswith("| softmax-ape | whole input | 3 | 0.00 M | **41.0 ± 1.0** | best |")
    listops = json.loads((tmp_path / "fnet-ape" / "config.json").read_text())
    del listops["max_length"]
    (tmp_path / "fnet-ape" / "config.json").write_text(json.dumps({**listops, "seq_len": None,
                                                                   "data_options": {"max_length": 250}}))
    assert {r["train_length"] for r in lra_folder_results(tmp_path)[0] if r["variant"] == "fnet-ape"} == {250}
    (tmp_path / "fnet-ape" / "seed0" / "result.json").write_text(json.dumps({"val_accuracy": 0.3}))
    with pytest.raises(ValueError, match=r"fnet-ape/seed0/result.json has no test_accuracy, num_parameters"):
        lra_folder_results(tmp_path)


def test_the_bold_group_is_holms_and_the_table_says_what_each_test_alone_gave():
    best = [1.0, 1.1, 1.2]
    values = {"best": best, "near": shifted_to_p([1.1, 1.2, 1.3], best, 0.03),
              "nearer": shifted_to_p([1.0, 1.3, 1.6], best, 0.04), "far": [3.0, 3.1, 3.2]}
    text = render_study(_records(validation=values), _meta(rows=tuple(values)))
    # uncorrected p 0.030 and 0.040 (out, each alone); Holm over 3 tests: 0.060 both, in the group
    near, nearer, far = (_line(text, f"| {r} | whole past") for r in ("near", "nearer", "far"))
    assert "** | 0.030 (0.060) |" in near and "** | 0.040 (0.060) |" in nearer
    assert "**" not in far and "| <0.001 |" in far
    assert ("* Best group on validation at [0,8), Holm over 3 tests: best, near, nearer (best best: 1.100 ± 0.100); "
            in text)
    assert "each test alone at 0.05 it would be best." in text
    assert "Holm-adjusted p ≥ 0.05" in text


def test_a_group_one_seed_holds_together_is_flagged_fragile_under_its_table():
    # b is in the group through its third seed's spread alone (tests/lab/test_study_rules.py)
    values = {"a": [1.0, 1.1, 1.2], "b": [1.30, 1.31, 1.9]}
    text = render_study(_records(validation=values), _meta(rows=("a", "b")))
    assert ("* Best group on validation at [0,8), Holm over 1 test: a, b (best a: 1.100 ± 0.100); fragile (1 of 6 "
            "one-seed drops change it; rows that enter or leave: b).") in text
    steady = render_study(_records(), _meta())
    assert "; stable (none of 9 one-seed drops changes it)" in steady and "fragile" not in steady


def test_the_pairs_the_docs_call_alike_get_their_equivalence_test_under_the_table():
    values = {**VALIDATION, "t1": [1.000, 1.001, 1.002], "t2": [1.001, 1.002, 1.003]}
    text = render_study(_records(validation=values), _meta(rows=tuple(values)),
                        equivalence=[("a", "b"), ("t1", "t2")])
    # a − b = −0.1 nats, se = √(0.02/3), ν = 4: 90 % interval −0.1 ± 2.132 · 0.0816 = [−0.274, +0.074]
    a_b = _line(text, "* Equivalence on validation, a − b")
    assert a_b.startswith("* Equivalence on validation, a − b (TOST within ± 0.020 nats, 0.05 each side; difference "
                          "[90 % interval], p): at [0,8): -0.100 [-0.274, +0.074], p = ")
    assert a_b.count("not shown equivalent") == 2  # the first and the last shown bucket
    t1_t2 = _line(text, "* Equivalence on validation, t1 − t2")
    assert ", equivalent; at [120,128): -0.001" in t1_t2 and "not shown" not in t1_t2
    assert "* Equivalence on validation" not in render_study(_records(), _meta())
    with pytest.raises(ValueError, match="names row 'zz'"):
        render_study(_records(), _meta(), equivalence=[("a", "zz")])


def _budget(study, tokens, validation):
    return [{**r, "train_tokens": tokens} for r in _records(study, validation=validation)], _meta(study, tuple(validation))


def test_claims_at_several_budgets_bold_each_budgets_group_and_say_which_rows_hold_at_every_one(tmp_path):
    from spe.lab.study_tables import plot_budgets, render_budgets

    # budget 1: VALIDATION (a best, b in its group: p = 0.146 > 0.05; c far behind); budget 2: b far
    # better than a (a leaves the group), c not run there
    small = _budget("s", 32, VALIDATION)
    large = _budget("l", 128, {"a": [1.0, 1.05, 1.1], "b": [0.5, 0.52, 0.54]})
    lines = render_budgets([large, small], ["a", "b", "c"])  # any order: columns by tokens
    assert _line("\n".join(lines), "| row |") == "| row | 0.00 M tokens (s) | 0.00 M tokens (l) |"
    rows = [line for line in lines if line.startswith("| a |") or line.startswith("| b |") or line.startswith("| c |")]
    validation, test = rows[:3], rows[3:]
    assert validation[0].startswith("| a | **1.210 ± 0.110 (3)** | 1.155 ± 0.055 (3) |")  # last bucket: 1.1 × first
    assert validation[1].startswith("| b | **1.320 ± 0.110 (3)** | **0.572 ± 0.022 (3)** |")
    assert validation[2] == "| c | 2.310 ± 0.110 (3) | – |"
    assert "**" not in "".join(test)  # the test split is only reported
    text = "\n".join(lines)
    assert "- s (32 tokens): best a; best group a, b (3 rows run)" in text
    assert "- l (128 tokens): best b; best group b (2 rows run)" in text
    # only budget s has every row: b is in its group, and the sentence says on how many budgets it rests
    assert text.endswith("In the best group at every budget where all 3 rows ran (1 of 2): a, b.")
    plot_budgets([small, large], ["a", "b", "c"], tmp_path / "b.png")
    assert (tmp_path / "b.png").stat().st_size > 0


def test_rows_run_later_at_a_budget_join_it_and_mismatched_studies_are_refused():
    from spe.lab.study_tables import render_budgets

    small = _budget("s", 32, {"a": VALIDATION["a"], "b": VALIDATION["b"]})
    later = _budget("s2", 32, {"c": VALIDATION["c"]})
    text = "\n".join(render_budgets([small, later], ["a", "b", "c"]))
    assert "0.00 M tokens (s + s2)" in text and "| c | 2.310 ± 0.110 (3) |" in text
    with pytest.raises(ValueError, match="studies s and s2 both hold rows \\['a'\\] at 32 tokens"):
        render_budgets([small, _budget("s2", 32, {"a": VALIDATION["a"]})], ["a", "b"])
    mixed = _budget("m", 32, VALIDATION)
    mixed[0][0]["train_tokens"] = 64
    with pytest.raises(ValueError, match="study m holds runs of 2 budgets"):
        render_budgets([mixed], ["a"])
    short = [r for r in _records("x") if r["bucket_start"] < 64], _meta("x")
    with pytest.raises(ValueError, match="study x ends at bucket \\[56,64\\), the others at \\[120,128\\)"):
        render_budgets([small, short], ["a"])


def test_a_seed_of_an_lra_experiment_study_reruns_bit_for_bit(tmp_path, capsys):
    """A study of one spe lra experiment (the FNet rows): its recorded command rerun whole for one seed."""
    from spe.lab.cli.main import main
    from spe.lab.study_data import lra_folder_results

    tool = _tool()
    options = ["--task", "listops", "--attention", "fnet", "--positional", "ape", "--steps", "8", "--batch-size", "4",
               "--seq-len", "48", "--eval-every", "4", "--model-option", "d_model=16", "--model-option", "num_layers=1",
               "--model-option", "d_ff=32", "--model-option", "num_heads=2"]
    assert main(["-q", "lra", *options, "--seeds", "0,1", "--threads", "1", "--out", str(tmp_path / "runs" / "fnet"),
                 "--no-progress"]) == 0
    command = "spe lra " + " ".join(options) + " --seeds 0,1 --threads 1 --out runs/x/fnet"
    meta = {"study": "tiny-lra", "command": command, "rows": {"fnet": {}}}
    assert tool.reproduction_command(meta, "fnet", 1, "o", 2) == ["lra", *options, "--seeds", "1", "--out", "o/fnet",
                                                                  "--threads", "2", "--no-progress"]
    runs, rows = lra_folder_results(tmp_path / "runs")
    records, meta = tool.synth_study(runs, study="tiny-lra", title="tiny", command=command, rows=rows)
    write_study(tmp_path / "data", records, meta, allow_dirty=True)
    capsys.readouterr()
    assert tool.main(["reproduce", "--study", "tiny-lra", "--row", "fnet", "--seed", "1", "--out",
                      str(tmp_path / "again"), "--data-dir", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out
    assert "tiny-lra fnet seed 1: 2 cells compared, 0 differ, 0 missing from the rerun" in out
    assert "commit: same" in out and "threads: same" in out and "experiment_sha256: same" in out
    # a committed record from before experiment_sha256 existed: said so, not called a difference
    meta_file = tmp_path / "data" / "tiny-lra.meta.json"
    old = json.loads(meta_file.read_text())
    for by_seed in old["provenance"].values():
        for record in by_seed.values():
            del record["experiment_sha256"]
    meta_file.write_text(json.dumps(old))
    assert tool.main(["reproduce", "--study", "tiny-lra", "--row", "fnet", "--seed", "1", "--out",
                      str(tmp_path / "again2"), "--data-dir", str(tmp_path / "data")]) == 0
    assert "experiment_sha256: not recorded by the committed run" in capsys.readouterr().out


def test_each_row_of_an_lra_study_reruns_its_own_experiment():
    """A study whose rows are separate spe lra experiments (FNet beside softmax and Performer): a
    row's recorded command is the one rerun, not the first row's; a row without one falls back to
    the study's command."""
    tool = _tool()
    meta = {"study": "lra-x", "command": "spe lra --task text --attention fnet --out runs/t/fnet-ape",
            "rows": {"fnet-ape": {},
                     "softmax-ape": {"command": "spe lra --task text --attention softmax --positional ape "
                                                "--seeds 0,1,2 --preset cpu-small --threads 1 --out runs/t/softmax-ape"}}}
    assert tool.reproduction_command(meta, "softmax-ape", 2, "o", 1) == [
        "lra", "--task", "text", "--attention", "softmax", "--positional", "ape", "--preset", "cpu-small",
        "--seeds", "2", "--out", "o/softmax-ape", "--threads", "1", "--no-progress"]
    assert tool.reproduction_command(meta, "fnet-ape", 0, "o", 1)[:5] == ["lra", "--task", "text", "--attention", "fnet"]


def test_an_lra_plan_folder_takes_its_rows_descriptions_and_title_from_the_plan(tmp_path, capsys):
    """write-lra --plan: the study of an spe lra --plan folder describes its rows as the plan does,
    records the plan's command, and refuses a folder row the plan lacks."""
    import json

    from spe.lab.cli.main import main

    options = ["--task", "listops", "--attention", "fnet", "--positional", "ape", "--steps", "4", "--batch-size", "4",
               "--seq-len", "48", "--eval-every", "4", "--model-option", "d_model=16", "--model-option", "num_layers=1",
               "--model-option", "d_ff=32", "--model-option", "num_heads=2"]
    assert main(["-q", "lra", *options, "--seeds", "0", "--threads", "1", "--out", str(tmp_path / "runs" / "fnet"),
                 "--no-progress"]) == 0
    plan = tmp_path / "plan.toml"
    plan.write_text('title = "Tiny ListOps plan"\ntask = "listops"\npreset = "cpu-small"\nseeds = [0]\n'
                    '[rows.fnet]\ndescription = "Fourier mixing, the plan\'s words"\nattention = "fnet"\n'
                    'positional = "ape"\n')
    tool = _tool()
    assert tool.main(["write-lra", "--runs", str(tmp_path / "runs"), "--study", "tiny", "--plan", str(plan),
                      "--data-dir", str(tmp_path / "data"), "--allow-dirty"]) == 0
    meta = json.loads((tmp_path / "data" / "tiny.meta.json").read_text())
    assert meta["title"] == "Tiny ListOps plan"
    assert meta["rows"]["fnet"]["description"] == "Fourier mixing, the plan's words"
    assert meta["command"] == f"spe lra --plan {plan} --out {tmp_path / 'runs'}"
    plan.write_text(plan.read_text().replace("[rows.fnet]", "[rows.other]"))
    capsys.readouterr()
    assert tool.main(["write-lra", "--runs", str(tmp_path / "runs"), "--study", "tiny", "--plan", str(plan),
                      "--data-dir", str(tmp_path / "data"), "--allow-dirty"]) == 2
    assert "holds rows ['fnet'] that plan" in capsys.readouterr().err


def test_a_growth_row_tests_per_seed_growths_on_validation_and_reports_the_split_named():
    """README's extrapolation rows: growth = last / first − 1 per seed (not a ratio of means), the
    least-growth group chosen on validation by the rules (Holm), the shown split only reported."""
    from spe.lab.study_tables import growth_row

    # first bucket 1.0 for every seed; last bucket per seed: a grows 10, 12, 14 %, b 11, 13, 15 %
    # (inside a's group), c 50, 52, 54 % (far outside); on test c's growth is the lowest
    last = {"a": [1.10, 1.12, 1.14], "b": [1.11, 1.13, 1.15], "c": [1.50, 1.52, 1.54]}
    records = _records(validation={n: [1.0, 1.0, 1.0] for n in last})
    for r in records:
        if r["bucket_start"] == 120:
            grown = last[r["variant"]][r["seed"]]
            r["value"] = 1.0 * grown if r["split"] == "validation" else (
                1.5 * (1.01 + 0.01 * r["seed"]) if r["variant"] == "c" else 1.5 * grown)
    line = growth_row(records, _meta(), question="Toy, 16 L", split="test", rows=["c"], source="[x](x.md)")
    cells = line.split(" | ")
    assert cells[0] == ("| Toy, 16 L: growth of the cross-entropy from [0,8) to [120,128), test split; 3.2e-05 M "
                        "training tokens a run; bold: least-growth group on validation (Holm, 2 tests)")
    # test: first bucket 1.5; c's last 1.515, 1.53, 1.545 -> +2 ± 1 %; a's 1.5 × 1.10.. -> +10 % ± 2 (× 1.5 / 1.5)
    assert cells[1] == "`c` +2.0 ± 1.0 % (3), `a` **+12.0 ± 2.0 % (3)**, `b` **+13.0 ± 2.0 % (3)**"
    # a mean of last / mean of first would be the same here; a seed whose first bucket differs tells them apart
    records = [{**r, "value": 2.0 * r["value"]} if (r["variant"], r["seed"], r["split"]) == ("a", 0, "test")
               and r["bucket_start"] in (0, 120) else r for r in records]
    assert "`a` **+12.0 ± 2.0 % (3)**" in growth_row(records, _meta(), question="q", split="test", rows=[], source="s")
    with pytest.raises(ValueError, match="no test growth from \\[0,8\\) to \\[120,128\\) for rows \\['d'\\]"):
        growth_row(records, _meta(), question="q", split="test", rows=["d"], source="s")
    with pytest.raises(ValueError, match="lower-is-better"):
        growth_row(records, {**_meta(), "metric": "accuracy"}, question="q", split="test", rows=[], source="s")


def test_a_summary_row_bolds_the_validation_group_and_shows_the_split_named():
    """README's results rows: the best group is chosen on validation even where the test split would
    order the rows otherwise; the shown split's values, its sort, the seeds and the budget are written."""
    from spe.lab.study_tables import summary_row

    records = _records(validation={"a": [1.0, 1.1, 1.2], "b": [1.1, 1.2, 1.3], "c": [2.0, 2.1, 2.2]})
    # on test, c becomes the lowest row: it must be listed first but stay outside the (validation) group
    records = [{**r, "value": 0.1 * r["value"]} if r["split"] == "test" and r["variant"] == "c" else r
               for r in records]
    line = summary_row(records, _meta(), question="Toy, 16 L", split="test", rows=["c"], source="[x](x.md)")
    cells = line.split(" | ")
    assert cells[0] == ("| Toy, 16 L: cross-entropy at [120,128), test split; 3.2e-05 M training tokens a run; "
                        "bold: best group on validation (Holm, 2 tests)")
    # test values of the last bucket: (v + 0.5) × 1.1 for a and b, 0.1 × that for c; mean ± std of 3 seeds
    assert cells[1] == "`c` 0.286 ± 0.011 (3), `a` **1.760 ± 0.110 (3)**, `b` **1.870 ± 0.110 (3)**"
    assert cells[2] == "[x](x.md) |"
    with pytest.raises(ValueError, match="no test value at \\[120,128\\) for rows \\['d'\\]"):
        summary_row(records, _meta(), question="q", split="test", rows=["d"], source="s")
    with pytest.raises(ValueError, match="no 'dense' split"):
        summary_row(records, _meta(), question="q", split="dense", rows=[], source="s")
