"""The shared plan runner (spe.lab.plans) on a fake task: a run returns a score from its options and seed, no training."""

import json
import math

import pytest

from spe.lab import plans
from spe.lab.plans import Column, PlanFormat, load_plan


def _row(table: dict, settings: dict) -> dict:
    unknown = sorted(set(table) - {"scale"})
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}; known: scale")
    return {"scale": float(table.get("scale", 1.0)) * settings["factor"]}


FAKE = PlanFormat(kind="fake plan", rows_key="rows", row_word="row", folder="music/configs", not_plans=("demo",),
                  top_keys=("factor",), settings=lambda top: {"factor": top.get("factor", 1.0)}, row=_row)

PLAN = """
title = "fake"
seeds = [0, 1, 2]
reference = "a"
factor = 2.0
[rows.a]
description = "first"
scale = 1.0
[rows.b]
scale = 3.0
"""


def _load(tmp_path, text=PLAN):
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return plans.load_plan(str(path), FAKE)


class FakeTask:
    """run(): score = scale × (seed + 1); records every call."""

    def __init__(self, plan):
        self.plan, self.calls = plan, []

    def run(self, name, seed, folder):
        self.calls.append((name, seed))
        return {"seed": seed, "score": self.plan.rows[name]["scale"] * (seed + 1)}


def test_a_plan_reads_title_seeds_reference_settings_and_rows(tmp_path):
    plan = _load(tmp_path)
    assert (plan.title, plan.seeds, plan.reference, plan.settings) == ("fake", [0, 1, 2], "a", {"factor": 2.0})
    assert plan.rows == {"a": {"scale": 2.0, "description": "first"}, "b": {"scale": 6.0, "description": ""}}
    defaults = _load(tmp_path, "[rows.x]\n")
    assert (defaults.title, defaults.seeds, defaults.reference) == ("plan", [0, 1, 2], None)


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.replace("[rows.b]", '[rows."../b"]'), r"fake plan .*plan.toml, row '../b': the name .* path separator"),
    (lambda t: t.replace("[rows.b]", '[rows.".b"]'), r"plan.toml, row '.b': the name .* starts with a dot"),
    (lambda t: t.replace("scale = 3.0", "scael = 3.0"), r"plan.toml, row 'b': unknown option\(s\) \['scael'\]"),
    (lambda t: t.replace("factor = 2.0", "factr = 2.0"), r"plan.toml: unknown top-level key\(s\) \['factr'\]; "
                                                         "known: title, seeds, reference, factor, rows"),
    (lambda t: t.replace("seeds = [0, 1, 2]", "seeds = []"), r"plan.toml: seeds .*got \[\]"),
    (lambda t: t.replace("seeds = [0, 1, 2]", "seeds = [0, 0]"), "plan.toml: seeds must be"),
    (lambda t: t.replace("seeds = [0, 1, 2]", "seeds = [-1]"), "plan.toml: seeds must be"),
    (lambda t: t.replace("seeds = [0, 1, 2]", 'seeds = "0,1"'), "plan.toml: seeds must be"),
    (lambda t: t.replace('reference = "a"', 'reference = "c"'), r"plan.toml: reference 'c' is not one of its rows \(a, b\)"),
    (lambda t: t.split("[rows.a]")[0], r"plan.toml has no \[rows.NAME\] tables"),
    (lambda t: t + "\n[[", "plan.toml is not valid TOML"),
    (lambda t: t.replace("[rows.b]\n", "").replace("scale = 3.0", "[rows]\nb = 3"), r"row 'b': give a table"),
])
def test_plan_mistakes_are_refused_naming_the_file_and_the_row(tmp_path, edit, message):
    with pytest.raises(ValueError, match=message):
        _load(tmp_path, edit(PLAN))


def test_a_plan_extends_another_merging_tables_and_appending_rows(tmp_path):
    (tmp_path / "base.toml").write_text(PLAN.replace("[rows.a]", "[defaults]\nx = 1\n[defaults.model]\nm = 1\nn = 2\n"
                                                     "[rows.a]"))
    child = tmp_path / "child.toml"
    child.write_text('extends = "base"\ntitle = "child"\nfactor = 3.0\n[defaults.model]\nn = 5\n'
                     '[rows.b]\nscale = 10.0\n[rows.c]\ndescription = "new"\n')
    seen = []

    def settings(top: dict) -> dict:  # records the merged top-level keys the task is given
        seen.append(top)
        return {"factor": top.get("factor", 1.0)}

    fmt = PlanFormat(kind="fake plan", rows_key="rows", row_word="row", folder="music/configs",
                     top_keys=("factor", "defaults"), settings=settings, row=_row)
    plan = plans.load_plan(str(child), fmt)
    assert (plan.title, plan.seeds, plan.reference, plan.settings) == ("child", [0, 1, 2], "a", {"factor": 3.0})
    assert seen[0]["defaults"] == {"x": 1, "model": {"m": 1, "n": 5}}  # merged key by key
    assert list(plan.rows) == ["a", "b", "c"]  # the base's rows first, a replaced row in its place
    assert plan.rows == {"a": {"scale": 3.0, "description": "first"}, "b": {"scale": 30.0, "description": ""},
                         "c": {"scale": 3.0, "description": "new"}}
    assert plan.path == str(child)


@pytest.mark.parametrize("text,message", [
    ('extends = "nowhere"\n', r"child.toml: extends 'nowhere'.*'nowhere'.*packaged"),
    ('extends = "child"\n', r"child.toml: extends 'child'.*this file itself"),
    ("extends = 3\n", r"child.toml: extends must name a plan, got 3"),
])
def test_a_bad_base_plan_is_refused_naming_the_file(tmp_path, text, message):
    child = tmp_path / "child.toml"
    child.write_text(text + "[rows.x]\n")
    with pytest.raises(ValueError, match=message):
        plans.load_plan(str(child), FAKE)


def test_plans_that_extend_each_other_are_a_cycle(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b"\n[rows.x]\n')
    (tmp_path / "b.toml").write_text('extends = "a"\n[rows.y]\n')
    with pytest.raises(ValueError, match=r"a.toml: extends 'b'.*b.toml: extends 'a'.*cycle"):
        plans.load_plan(str(tmp_path / "a.toml"), FAKE)


def test_a_local_plan_named_like_a_packaged_one_extends_the_packaged_one(tmp_path):
    from spe.lab.plans import load_plan

    local = tmp_path / "ablation.toml"
    local.write_text('extends = "ablation"\ntitle = "mine"\nseeds = [7]\n')
    plan, packaged = load_plan(str(local), "music"), load_plan("ablation", "music")
    assert (plan.title, plan.seeds, plan.path) == ("mine", [7], str(local))
    assert plan.rows == packaged.rows and plan.rows


def test_a_missing_plan_names_the_packaged_ones(tmp_path):
    with pytest.raises(ValueError, match=r"'.*nowhere.toml'.*packaged.*ablation"):
        plans.load_plan(str(tmp_path / "nowhere.toml"), FAKE)
    assert "demo" not in plans.packaged_plans(FAKE)


def _plain(results: dict) -> dict:
    """Row -> seed -> result without its provenance (times and host differ from run to run)."""
    return {name: {seed: {k: v for k, v in r.items() if k != "provenance"} for seed, r in by_seed.items()}
            for name, by_seed in results.items()}


def test_runs_are_resumed_finished_ones_skipped_and_a_missing_one_rerun(tmp_path):
    plan, out = _load(tmp_path), tmp_path / "out"
    task = FakeTask(plan)
    results = _plain(plans.run_plan(plan, out, task.run))
    assert task.calls == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]  # seed by seed
    assert results["b"] == {0: {"seed": 0, "score": 6.0}, 1: {"seed": 1, "score": 12.0}, 2: {"seed": 2, "score": 18.0}}
    stored = json.loads((out / "b" / "seed2" / plans.RESULT_FILE).read_text())
    assert stored.pop("provenance")["commit"] is not None and stored == {"seed": 2, "score": 18.0}

    task.calls.clear()
    after = []
    again = _plain(plans.run_plan(plan, out, task.run, after=lambda *call: after.append(call)))
    assert task.calls == [] and after == [] and again == results  # everything finished: read back

    (out / "a" / "seed1" / plans.RESULT_FILE).unlink()  # e.g. a run stopped before its end
    assert _plain(plans.run_plan(plan, out, task.run, by_seed=False)) == results
    assert task.calls == [("a", 1)] and after == []

    task.calls.clear()
    stale = _plain(plans.run_plan(plan, out, task.run, rows=["b"], seeds=[0, 5],
                                  current=lambda name, seed, stored: stored["score"] != 6.0,
                                  after=lambda *c: after.append(c)))
    assert task.calls == [("b", 0), ("b", 5)] and [c[:2] for c in after] == [("b", 0), ("b", 5)]
    assert stale == {"b": {0: {"seed": 0, "score": 6.0}, 5: {"seed": 5, "score": 36.0}}}
    # collected from the folders: every seed found, nothing from a neighbouring folder
    (out / "a" / "seed0-evaluation").mkdir()
    (out / "a" / "seed0-evaluation" / plans.RESULT_FILE).write_text("{}")
    assert list(plans.collect(plan, out)["b"]) == [0, 1, 2, 5] and list(plans.collect(plan, out)["a"]) == [0, 1, 2]


def test_a_failing_run_does_not_stop_the_others_and_is_named_at_the_end(tmp_path):
    plan, out = _load(tmp_path), tmp_path / "out"

    def run(name, seed, folder):
        if (name, seed) == ("a", 1):
            raise ArithmeticError("loss became NaN")
        return {"seed": seed}

    with pytest.raises(plans.RunsFailed, match=r"a/seed1 failed.*a/seed1: loss became NaN"):
        plans.run_plan(plan, out, run, failures=(ArithmeticError,))
    assert sorted(plans.collect(plan, out)["a"]) == [0, 2] and sorted(plans.collect(plan, out)["b"]) == [0, 1, 2]
    with pytest.raises(KeyError):  # any other error stops the plan at once
        plans.run_plan(plan, tmp_path / "other", lambda *a: {}[0], failures=(ArithmeticError,))


def test_rows_are_selected_by_name_in_plan_order(tmp_path):
    plan = _load(tmp_path)
    assert plans.select_rows(plan, ["b", "a"]) == ["a", "b"] and plans.select_rows(plan, None) == ["a", "b"]
    with pytest.raises(ValueError, match=r"unknown row\(s\) c of fake plan .*plan.toml; rows: a, b"):
        plans.select_rows(plan, ["c"])


def test_the_summary_is_the_mean_and_sample_std_and_one_seed_shows_a_dash(tmp_path):
    plan, out = _load(tmp_path), tmp_path / "out"
    plans.run_plan(plan, out, FakeTask(plan).run, rows=["a"])
    plans.run_plan(plan, out, FakeTask(plan).run, rows=["b"], seeds=[0])
    collected = plans.collect(plan, out)
    metrics = {"score": lambda r: r["score"], "half": lambda r: r["score"] / 2}
    a = plans.summarize(collected["a"], metrics)
    # a: scores 2, 4, 6: mean 4; squared deviations 4 + 0 + 4 = 8, / (n − 1) = 4, sample std 2
    # (the population std would be √(8/3) = 1.633)
    assert a["seeds"] == [0, 1, 2]
    assert a["score"] == pytest.approx((4.0, 2.0), rel=1e-15) and a["half"] == pytest.approx((2.0, 1.0), rel=1e-15)
    b = plans.summarize(collected["b"], metrics)  # one seed: score 6, no spread
    assert b["seeds"] == [0] and b["score"][0] == 6.0 and math.isnan(b["score"][1])
    assert plans.summarize({}, metrics) == {"seeds": [], "score": None, "half": None}
    rows = [{"name": "a", **a}, {"name": "b", **b}, {"name": "c", "score": None}]
    table = plans.markdown_table(rows, [Column("row", cell=lambda r: r["name"]), Column("score", metric="score"),
                                        Column("half", metric="half", digits=1)])
    assert table == ["| row | score | half |", "|---|---|---|", "| a | 4.00 ± 2.00 | 2.0 ± 1.0 |",
                     "| b | 6.00 ± – | 3.0 ± – |", "| c | – | – |"]


@pytest.mark.slow
def test_run_once_locks_the_folder_and_reads_a_result_written_meanwhile(tmp_path):
    from spe.lab.engine.run_folder import RunFolderBusy
    from tiny_run import hold_lock

    folder = tmp_path / "row" / "seed0"
    holder = hold_lock(folder)
    try:
        with pytest.raises(RunFolderBusy, match="in use by another spe process"):
            plans.run_once(folder, lambda f: {"x": 1})
        plans.write_result(folder, {"x": 2})  # the other runner finished it
        assert plans.run_once(folder, lambda f: pytest.fail("ran again")) == {"x": 2}
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_a_run_another_process_holds_is_left_for_last_and_read_if_it_finished_meanwhile(tmp_path):
    import signal

    from spe.lab.engine.run_folder import RunFolderBusy
    from tiny_run import hold_lock

    plan, out = _load(tmp_path), tmp_path / "out"
    holder = hold_lock(out / "a" / "seed0")
    try:
        task = FakeTask(plan)
        with pytest.raises(RunFolderBusy, match=r"a/seed0 .*in use.*PID .*the other 5 run\(s\) are done"):
            plans.run_plan(plan, out, task.run)
        # every other run ran before the refusal: one busy folder does not stop a runner
        assert sorted(task.calls) == [("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]

        class FinishesTheHeldRun(FakeTask):  # the other process ends, its result written, while we run
            def run(self, name, seed, folder):
                if (name, seed) == ("b", 2):
                    plans.write_result(out / "a" / "seed0", {"seed": 0, "score": -1.0})
                    holder.send_signal(signal.SIGKILL)
                    holder.wait()
                return super().run(name, seed, folder)

        (out / "b" / "seed2" / plans.RESULT_FILE).unlink()  # one run left to do, during which a/seed0 ends
        task = FinishesTheHeldRun(plan)
        results = plans.run_plan(plan, out, task.run)
        assert task.calls == [("b", 2)]  # a/seed0 was read, not rerun
        assert results["a"][0]["score"] == -1.0
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("name", ["results.md", "results.json"])
def test_a_folder_holding_another_tools_results_is_refused_before_any_run(tmp_path, name):
    plan, out = _load(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / name).write_text("my notes\n")
    task = FakeTask(plan)
    with pytest.raises(ValueError, match=rf"--out .*out holds no spe results but {name}"):
        plans.run_plan(plan, out, task.run)
    assert task.calls == [] and (out / name).read_text() == "my notes\n"
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_a_folder_of_another_kind_is_refused_and_older_unmarked_runs_are_kept(tmp_path):
    plan, out = _load(tmp_path), tmp_path / "out"
    plans.claim_folder(out, "synth")
    (out / "results.md").write_text("the synth experiment's table\n")
    with pytest.raises(ValueError, match=r"out .*'synth' \(.spe-run\).*fake plan"):
        plans.run_plan(plan, out, FakeTask(plan).run)
    older = tmp_path / "older"  # a plan's folder from before the marker: its runs make it spe's
    plans.write_result(plans.run_folder(older, "a", 0), {"seed": 0, "score": 2.0})
    (older / "results.md").write_text("table\n")
    task = FakeTask(plan)
    plans.run_plan(plan, older, task.run, seeds=[0])
    assert task.calls == [("b", 0)]



def test_a_broken_result_file_is_named(tmp_path):
    (tmp_path / "a" / "seed0").mkdir(parents=True)
    (tmp_path / "a" / "seed0" / "result.json").write_text("{half")
    with pytest.raises(ValueError, match=r"a/seed0/result.json.*not valid JSON"):
        plans.read_results(tmp_path / "a")


def test_results_collected_before_any_run_belong_to_the_first_kind_that_runs(tmp_path):
    plan, out = _load(tmp_path), tmp_path / "out"
    with plans.results_lock(out):  # an empty collection writes its tables first
        (out / "results.md").write_text("nothing has run\n")
    task = FakeTask(plan)
    plans.run_plan(plan, out, task.run, seeds=[0])
    assert len(task.calls) == 2
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "results.json").write_text("{}")
    with pytest.raises(ValueError, match="holds no spe results but results.json"), plans.results_lock(foreign):
        pytest.fail("the lock was given over another tool's results")


def test_a_music_plan_written_with_variants_reads_as_rows_and_says_the_new_name(tmp_path, caplog):
    import logging

    old = tmp_path / "old.toml"
    old.write_text('[variants.a]\nmodel = { positional = "ape" }\n')
    with caplog.at_level(logging.INFO):
        plan = load_plan(str(old), "music")
    assert list(plan.rows) == ["a"] and plan.rows["a"]["train"]["model"]["positional"] == "ape"
    assert "variants is the old name of rows" in caplog.text
    both = tmp_path / "both.toml"
    both.write_text('[variants.a]\nmodel = { positional = "ape" }\n[rows.b]\nmodel = { positional = "ape" }\n')
    with pytest.raises(ValueError, match="both.toml: variants is the old name of rows: give rows only"):
        load_plan(str(both), "music")


def test_every_task_runs_its_plans_through_the_one_runner():
    """One plan vocabulary: every task's plans have [rows.NAME] tables and are run by plans.run."""
    from spe.lab.plans import PLAN_TASKS, PlanTask, plan_task

    assert set(PLAN_TASKS) == {"music", "lra", "synth"}
    for name in PLAN_TASKS:
        cls = plan_task(name)
        assert issubclass(cls, PlanTask) and cls.name == name and cls.format.task == name
        assert cls.format.rows_key == "rows" and cls.format.row_word == "row"
    with pytest.raises(ValueError, match="unknown task 'nope'; tasks: music, lra, synth"):
        plan_task("nope")
