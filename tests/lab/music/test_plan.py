"""spe sweep: variants × seeds from a plan, resumable, test-time variants reuse checkpoints."""

import json
import warnings

import pytest
from tiny_run import table_rows

from spe.lab.cli.main import main
from spe.lab.plans import load_plan

PLAN = """
title = "tiny"
seeds = [0, 1]
reference = "ape"
seq_len = 16
batch_size = 2
steps = 2
eval_every = 2
threads = 1
[model]
d_model = 16
num_layers = 1
num_heads = 2
d_ff = 32
num_realizations = 4
[variants.ape]
model = { positional = "ape" }
[variants.spe]
description = "sineSPE"
model = { positional = "sinespe" }
[variants.spe-2-draws]
checkpoints_of = "spe"
eval = { num_draws = 2, num_realizations = 8 }
"""


@pytest.mark.slow
def test_sweep_trains_each_variant_and_seed_once_and_tabulates(midi_folder, tmp_path, capsys):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    out = tmp_path / "sweep"
    args = ["sweep", "--plan", str(plan), "--out", str(out), "--data", str(midi_folder),
            "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fixture's corrupt file is reported while tokenising
        assert main(args) == 0
    doc = json.loads((out / "results.json").read_text())
    assert sorted(doc["runs"]) == ["ape/seed0", "ape/seed1", "spe-2-draws/seed0", "spe-2-draws/seed1",
                                   "spe/seed0", "spe/seed1"]
    assert not (out / "spe-2-draws").joinpath("seed0", "model.safetensors").exists()  # reuses spe's runs
    spe0, draws0 = doc["runs"]["spe/seed0"], doc["runs"]["spe-2-draws/seed0"]
    assert [b["start"] for b in spe0["buckets"]] == [0, 16, 32]
    assert spe0["buckets"][0]["ce"] != draws0["buckets"][0]["ce"]  # other test-time options, other numbers
    assert doc["runs"]["ape/seed0"]["buckets"][0]["ce"] != doc["runs"]["ape/seed1"]["buckets"][0]["ce"]
    table = (out / "results.md").read_text()
    assert "| spe | sinespe/performer window 16 | 2 |" in table and "±" in table and "+0.0%" in table  # ape vs itself
    stamp = (out / "ape" / "seed0" / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert main(args) == 0  # everything finished: nothing is trained again
    assert (out / "ape" / "seed0" / "model.safetensors").stat().st_mtime_ns == stamp
    assert "| ape | ape/performer | 2 |" in capsys.readouterr().out


def test_plan_errors_name_the_file_and_variant(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[variants.x]\nmodel = { positional = "rope2" }\n')
    with pytest.raises(ValueError, match=r"bad.toml, row 'x'.*rope2"):
        load_plan(str(bad), "music")
    bad.write_text('[variants.x]\ncheckpoints_of = "y"\n')
    with pytest.raises(ValueError, match="checkpoints_of"):
        load_plan(str(bad), "music")
    bad.write_text('[variants.x]\neval = { bucket_width = 0 }\n')
    with pytest.raises(ValueError, match=r"row 'x'.*bucket_width"):
        load_plan(str(bad), "music")
    for text, message in (('[variants.x]\nmodel = 5\n', r"bad.toml, row 'x': model must be a table .*got 5"),
                          ('eval = "fast"\n[variants.x]\n', r"bad.toml: eval must be a table of options .*'fast'")):
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_plan(str(bad), "music")
    with pytest.raises(ValueError, match="neither a file"):
        load_plan(str(tmp_path / "missing.toml"), "music")
    plan = load_plan("ablation", "music")  # the packaged plan parses
    assert plan.reference == "ape" and plan.seeds == [0, 1, 2] and "sinespe" in plan.variants


@pytest.mark.slow
def test_sweep_refuses_to_reuse_a_run_trained_with_other_options(midi_folder, tmp_path, capsys):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.replace("seeds = [0, 1]", "seeds = [0]"))
    out = tmp_path / "sweep"
    args = ["sweep", "--plan", str(plan), "--out", str(out), "--data", str(midi_folder), "--only", "ape",
            "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(args) == 0
    plan.write_text(PLAN.replace('model = { positional = "ape" }', 'model = { positional = "ape", d_ff = 48 }'))
    capsys.readouterr()
    assert main([*args, "--seeds", "0"]) == 2
    assert "was trained with model options" in capsys.readouterr().err


def test_the_packaged_ablation_keeps_its_runs_whole_past():
    # Its runs were trained before SPE models got a window of the training length by default:
    # unless a variant sets one, the resolved model attends to the whole past, so finished
    # runs still match their plan.
    from spe.lab.music.config import TrainConfig

    plan = load_plan("ablation", "music")
    windows = {name: TrainConfig.from_dict(v["train"]).model_config(300).attention_window
               for name, v in plan.variants.items()}
    assert {name: w for name, w in windows.items() if w is not None} == {
        "sinespe-ungated-trained-w128": 128, "ape-trained-w128": 128}


def test_threads_override_every_variant_and_a_finished_run_is_still_reused(tmp_path):
    from spe.lab.music.plan import variant_config
    from spe.lab.music.status import RESUME_KEYS

    plan = load_plan("peers", "music")
    assert variant_config(plan, "sinespe", 0, tmp_path).threads == 2  # the main job's
    assert variant_config(plan, "sinespe", 0, tmp_path, threads=1).threads == 1
    assert "threads" not in RESUME_KEYS  # how many cores trained a run does not make it another run


@pytest.mark.slow
def test_every_peer_builds_and_reaches_three_times_its_training_length(tmp_path):
    """The peers plan is the comparison with the encodings the field ships for linear attention: each variant's model must build, and its
    positions must reach the evaluation's 3× the training length (cosFormer's L_max)."""
    import torch

    from spe.checkpoint import max_positions
    from spe.lab.music.plan import variant_config
    from spe.models import DecoderLM

    plan = load_plan("peers", "music")
    expected = {"ape", "rope", "sinespe", "convspe", "lrpe", "permute", "cosformer", "decay", "rope-decay",
                "sinespe-decay"}
    assert set(plan.variants) == expected
    for name in plan.variants:
        cfg = variant_config(plan, name, 0, tmp_path)
        config = cfg.model_config(486)
        model = DecoderLM(config)
        limit = max_positions(config)
        assert limit is None or limit >= 3 * cfg.seq_len, (name, limit)
        with torch.no_grad():
            logits = model(torch.zeros(1, 3 * cfg.seq_len, dtype=torch.long))
        assert torch.isfinite(logits).all(), name
    assert variant_config(plan, "decay", 0, tmp_path).model["decay"] == "fixed"


def test_side_by_side_sweeps_and_an_older_results_file_keep_every_run(tmp_path):
    """Sweeps on one folder (``--only`` lists, one core each) rebuild results.json from the runs' own
    records, so neither loses the other's; a results.json written before runs held their records
    (every run recorded there only) is adopted: its runs keep their numbers and count as finished."""
    from spe.lab import plans
    from spe.lab.plans import read_result, write_result

    plan = load_plan("peers", "music")

    def run(variant, seed, value):
        return {"variant": variant, "seed": seed, "step": 500, "eval": {}, "buckets": [{"start": 0, "end": 256, "ce": value, "std": 0.0, "n": 1}],
                "within": value, "beyond": value, "num_sequences": 1, "train_s": 1.0}

    unigram = [{"start": 0, "end": 256, "ce": 4.0}]
    (tmp_path / "results.json").write_text(json.dumps(  # an older sweep's: ape and rope recorded only here
        {"title": plan.title, "runs": {"ape/seed0": run("ape", 0, 1.5), "rope/seed0": run("rope", 0, 2.0)},
         "unigram_buckets": unigram}))
    write_result(tmp_path / "ape" / "seed0", run("ape", 0, 1.0))  # ape since run again: its own record wins
    write_result(tmp_path / "sinespe" / "seed0", {**run("sinespe", 0, 3.0), "unigram_buckets": unigram})  # another runner's
    written = plans.collect_results(plan, tmp_path)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk == written and on_disk["unigram_buckets"] == unigram
    assert {k: r["within"] for k, r in on_disk["runs"].items()} == {
        "ape/seed0": 1.0, "rope/seed0": 2.0, "sinespe/seed0": 3.0}
    assert read_result(tmp_path / "rope" / "seed0") == {**run("rope", 0, 2.0), "unigram_buckets": unigram}
    assert "unigram_buckets" not in on_disk["runs"]["sinespe/seed0"]
    assert "| sinespe |" in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize("name,problem", [("../../x", "holds a path separator"), ("/tmp/abs", "holds a path separator"),
                                          ("", "is empty"), (".", "starts with a dot"), ("..", "holds '..'"),
                                          ("a\\u0007b", "unprintable")])
def test_variant_names_are_names_not_paths(tmp_path, name, problem, capsys):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.replace("[variants.spe]", f'[variants."{name}"]').replace('checkpoints_of = "spe"',
                                                                                  f'checkpoints_of = "{name}"'))
    with pytest.raises(ValueError, match=rf"plan .*plan.toml, row .*: the name .* {problem}"):
        load_plan(str(plan), "music")
    out = tmp_path / "a" / "b" / "sweep"
    assert main(["sweep", "--plan", str(plan), "--out", str(out), "--steps", "1", "--no-progress"]) == 2
    assert "row" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["plan.toml"]  # nothing written, inside --out or not


@pytest.mark.slow
def test_a_variant_evaluates_the_test_split_in_buckets_of_l_up_to_16_l(midi_folder, tmp_path):
    """The gates study's 16× protocol in a sweep, scaled down to L = 8: test pieces of at least 129 tokens."""
    plan = tmp_path / "plan.toml"
    plan.write_text('seeds = [0]\nseq_len = 8\nbatch_size = 2\nsteps = 2\neval_every = 2\nthreads = 1\n'
                    'test_min_tokens = 129\nnum_test_pieces = 2\n'
                    '[model]\nd_model = 16\nnum_layers = 1\nnum_heads = 2\nd_ff = 32\n'
                    '[variants.ape]\nmodel = { positional = "ape" }\neval = { split = "test" }\n')
    out = tmp_path / "sweep"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fixture's corrupt file is reported while tokenising
        assert main(["sweep", "--plan", str(plan), "--out", str(out), "--data", str(midi_folder),
                     "--cache-dir", str(tmp_path / "cache"), "--no-progress"]) == 0
    run = json.loads((out / "results.json").read_text())["runs"]["ape/seed0"]
    assert run["num_sequences"] == 2
    assert [(b["start"], b["end"]) for b in run["buckets"]] == [(8 * k, 8 * k + 8) for k in range(16)]
    # the split a study selects on, in the same buckets as far as its pieces reach
    validation = run["validation"]
    assert validation["num_sequences"] >= 1 and 8 <= validation["max_length"] <= 128
    assert [(b["start"], b["end"]) for b in validation["buckets"]] == [
        (8 * k, 8 * k + 8) for k in range(validation["max_length"] // 8)]
    assert validation["buckets"][0]["ce"] != run["buckets"][0]["ce"]  # other pieces
    assert run["train_tokens"] == 2 * 2 * 8 and run["params"] > 1000  # steps × batch × L; the model's
    # a record from before the validation buckets is evaluated again, not trained again
    stored = out / "ape" / "seed0" / "result.json"
    stamp = (out / "ape" / "seed0" / "model.safetensors").stat().st_mtime_ns
    stored.write_text(json.dumps({k: v for k, v in json.loads(stored.read_text()).items() if k != "validation"}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["sweep", "--plan", str(plan), "--out", str(out), "--data", str(midi_folder),
                     "--cache-dir", str(tmp_path / "cache"), "--no-progress"]) == 0
    assert json.loads(stored.read_text())["validation"] == validation
    assert (out / "ape" / "seed0" / "model.safetensors").stat().st_mtime_ns == stamp
    # the study's records: a record from before params and train_tokens gets them from its plan and checkpoint
    from spe.lab.study_data import sweep_study

    records, _ = sweep_study(load_plan(str(plan), "music"), out, study="s", corpus="c", command="x")
    stored.write_text(json.dumps({k: v for k, v in json.loads(stored.read_text()).items()
                                  if k not in ("params", "train_tokens")}))
    assert sweep_study(load_plan(str(plan), "music"), out, study="s", corpus="c", command="x")[0] == records
    assert {r["split"] for r in records} == {"test", "validation"} and records[0]["params"] == run["params"]


@pytest.mark.parametrize(("variants", "message"), [
    ('[variants.x]\neval = { split = "tset" }\n',
     r"row 'x': eval option split .*validation, train, all, test.*got 'tset'"),
    ('[variants.x]\n[variants.y]\ncheckpoints_of = "x"\neval = { split = "test" }\n',
     r"row 'y': .*split = \"test\".*test_min_tokens.*row 'x'"),
])
def test_a_plan_evaluating_a_split_its_runs_do_not_hold_is_refused(tmp_path, variants, message):
    bad = tmp_path / "bad.toml"
    bad.write_text(variants)
    with pytest.raises(ValueError, match=message):
        load_plan(str(bad), "music")


GATES_ROWS = {"ape", "fox", "gated", "gated-channel", "linear-gated", "sinespe-gated", "sinespe-linear-gated",
              "rope-gated", "permute-gated"}
LEARNED_TIME_ROWS = {"ape", "sinespe", "sinespe-whole", "gated", "gated-channel", "fox", "sinespe-gated-whole",
                     "sinespe-gated-channel-whole", "foxpro", "path", "path-fox", "rope-learned",
                     "rope-learned-gated", "sinespe-learned", "sinespe-learned-gated",
                     "sinespe-learned-gated-channel", "sinespe-learned-linear-gated", "sinespe-onset"}
SIXTEEN_X_PLANS = [("gates", 64, GATES_ROWS), ("gates-palestrina", 256, GATES_ROWS),
                   ("learned-time", 64, LEARNED_TIME_ROWS), ("learned-time-palestrina", 256, LEARNED_TIME_ROWS)]


@pytest.mark.slow
@pytest.mark.parametrize("plan_name,length,rows", SIXTEEN_X_PLANS)
def test_every_16x_variant_builds_and_decodes_its_16x_test_length(tmp_path, plan_name, length, rows):
    """The gates and learned-time studies: every row builds, is evaluated on the held-out test split
    in buckets of L up to 16 L, and a shrunken copy of its model runs 16 L positions (the test
    pieces' length) with step-by-step decoding equal to the parallel forward where it matters, at
    the end."""
    import dataclasses

    import torch

    from spe.encodings.onset import onset_tokens, reads_onsets
    from spe.lab.music.corpus import make_tokenizer
    from spe.lab.music.plan import variant_config
    from spe.models import DecoderLM

    plan = load_plan(plan_name, "music")
    assert rows <= set(plan.variants)
    vocab = len(make_tokenizer())
    for name, spec in plan.variants.items():
        cfg = variant_config(plan, name, 0, tmp_path)
        assert (cfg.seq_len, cfg.test_min_tokens) == (length, 16 * length + 1), name
        assert spec["eval"]["split"] == "test" and spec["eval"]["bucket_width"] == length, name
        config = dataclasses.replace(cfg.model_config(vocab), d_model=16, num_heads=2, num_layers=1, d_ff=16,
                                     num_realizations=4, num_features=8, dropout=0.0)
        if reads_onsets(config):  # what spe train sets from the corpus (spe.lab.music.task.onset_settings)
            config = dataclasses.replace(config, onset_tokens=onset_tokens(make_tokenizer().vocab), onset_scale=3.0)
        model = DecoderLM(config).eval()
        tokens = torch.randint(0, vocab, (1, 16 * 64), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            logits = model(tokens)
            state = None
            for t in range(3):
                step, state = model.step(tokens[:, t], state)
                torch.testing.assert_close(step, logits[:, t], rtol=1e-4, atol=1e-4)
        assert torch.isfinite(logits).all(), name


def test_the_table_gives_the_sample_std_over_seeds_and_a_dash_for_one_seed():
    from spe.lab.music.plan import results_table, summarize_runs

    def run(variant, seed, ce0, ce1):
        return {"variant": variant, "seed": seed, "buckets": [{"start": 0, "end": 256, "ce": ce0},
                                                             {"start": 256, "end": 512, "ce": ce1}]}

    # ape, 3 seeds: [0,256) ce 1, 2, 4 (mean 7/3, sample std √(7/3) = 1.528); [256,512) 2, 3, 4 (std 1);
    # growth per seed 1, 0.5, 0 (mean 0.5, sample std 0.5). rope, one seed: no spread.
    runs = [run("ape", 0, 1.0, 2.0), run("ape", 1, 2.0, 3.0), run("ape", 2, 4.0, 4.0), run("rope", 0, 1.5, 3.0)]
    doc = {"runs": {f"{r['variant']}/seed{r['seed']}": r for r in runs}}
    plan = load_plan("peers", "music")
    rows = {r["variant"]: r for r in summarize_runs(doc, plan)}
    assert rows["ape"]["buckets"][0][1] == pytest.approx((7 / 3) ** 0.5, rel=1e-12)
    cells = table_rows("\n".join(results_table(doc, plan)), "variant")
    columns = ("seeds", "[0,256)", "[256,512)", "growth", "[0,256) vs ape")
    assert [cells["ape"][c] for c in columns] == ["3", "2.333 ± 1.528", "3.000 ± 1.000", "+50.0 ± 50.0 %", "+0.0%"]
    assert [cells["rope"][c] for c in columns] == ["1", "1.500 ± –", "3.000 ± –", "+100.0 ± – %", "-35.7%"]


@pytest.mark.parametrize("plan_name,length", [("learned-time", 64), ("learned-time-palestrina", 256)])
def test_every_learned_time_row_states_the_window_it_trains_with(tmp_path, plan_name, length):
    """Each description says "window: L" or "window: whole past", and the resolved model has that
    window: sineSPE alone keeps L (as in docs/gates.md), sineSPE under a gate attends to the whole
    past like the gate rows (the confound of docs/gates.md removed)."""
    from spe.lab.music.plan import variant_config
    from spe.lab.music.config import resolve_model_options

    plan = load_plan(plan_name, "music")
    assert set(plan.variants) == LEARNED_TIME_ROWS and plan.seeds == [0, 1, 2]
    for name, spec in plan.variants.items():
        cfg = variant_config(plan, name, 0, tmp_path)
        window = resolve_model_options(cfg.model, cfg.seq_len).get("attention_window") or None
        said = spec["description"].rsplit("window: ", 1)[1]
        assert said.startswith("whole past" if window is None else "L"), (name, window, said)
        assert window in (None, length), name
    assert "window: L" in plan.variants["sinespe"]["description"]
    assert variant_config(plan, "fox", 0, tmp_path).data == (
        "music21:palestrina/2" if plan_name.endswith("palestrina") else None)
    from spe.lab import plans  # the results name the data the plan names

    assert plans.collect_results(plan, tmp_path / "out")["data"] == (
        "music21:palestrina/2" if plan_name.endswith("palestrina") else "Bach chorales (music21)")


@pytest.mark.parametrize("plan_name", ["learned-time", "learned-time-palestrina"])
def test_the_data_dependent_rows_state_their_window_and_mechanism(plan_name):
    """The learned-time rows: each description states the whole past as its window, and each model
    names the mechanism its row tests."""
    variants = load_plan(plan_name, "music").variants
    rows = {name: {"description": v["description"], "model": v["train"]["model"]}
            for name, v in variants.items()}
    data_dependent = {"foxpro", "path", "path-fox", "rope-learned", "rope-learned-gated", "sinespe-onset",
                      "sinespe-learned", "sinespe-learned-gated", "sinespe-learned-gated-channel",
                      "sinespe-learned-linear-gated"}
    for name in data_dependent:
        assert "window: whole past" in rows[name]["description"], name
    assert rows["foxpro"]["model"].items() >= {"output_gate": True, "qk_norm": True, "kv_shift": True,
                                              "output_norm": True}.items()
    assert rows["path-fox"]["model"]["decay"] == "gated" and rows["path"]["model"]["attention"] == "softmax"
    assert rows["sinespe-learned-linear-gated"]["model"]["attention"] == "linear"
    assert rows["sinespe-onset"]["model"]["spe_time"] == "onset"
    assert {rows[n]["model"].get("rope_time") for n in ("rope-learned", "rope-learned-gated")} == {"learned"}


@pytest.mark.parametrize("name", ["results.md", "results.json"])
def test_a_sweep_folder_holding_another_tools_results_is_refused_before_any_run(tmp_path, capsys, name):
    from spe.lab.cli.main import main

    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("{}\n")
    assert main(["sweep", "--plan", "peers", "--only", "ape", "--steps", "1", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"holds no spe results but {name}" in err, err
    assert [p.name for p in out.iterdir()] == [name] and (out / name).read_text() == "{}\n"
