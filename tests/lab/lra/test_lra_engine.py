"""spe lra on the training engine: every crash window then the same command gives the uninterrupted
run's weights and result; training states that would run code are refused; --compile; the new flags."""

import functools
import json
import pickle
import shutil
import warnings

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import Kill, lra_splits, tiny_lra_config

from spe.checkpoint import TRAIN_STATE_FILE
import spe.lab.lra.train as lra_train
from spe.lab.cli.main import main
from spe.lab.lra.train import train_seed
from spe.lab.engine import core as engine, state
from spe.lab.engine.state import CHECKPOINTS_DIR

# 6 steps, a validation and a checkpoint unit every 2; the best validation is at step 2.
STEPS = 6


def _cfg(**kw):
    return tiny_lra_config(**{"steps": STEPS, **kw})


def _without_seconds(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "seconds"}


def _weights(folder, sub) -> dict:
    return load_file(str(folder / sub / "model.safetensors"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lra") / "whole"
    result = train_seed(_cfg(), lra_splits(), 0, folder, progress=False)
    return folder, result


def _assert_same_run(folder, uninterrupted):
    whole, result = uninterrupted
    again = json.loads((folder / "result.json").read_text())
    assert _without_seconds(again) == _without_seconds(result)
    for sub in ("last", "best"):
        a, b = _weights(whole, sub), _weights(folder, sub)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), sub
    records = [[_without_seconds(json.loads(line)) for line in (f / "metrics.jsonl").read_text().splitlines()]
               for f in (whole, folder)]
    assert records[0] == records[1]


def _kill_once(monkeypatch, module, name, when):
    """Makes ``module.name`` raise Kill on the first call for which ``when(*args)`` is true."""
    original = getattr(module, name)
    fired = []

    def wrapper(*args, **kwargs):
        if not fired and when(*args, **kwargs):
            fired.append(True)
            raise Kill
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return lambda: monkeypatch.setattr(module, name, original)


KILLS = {
    # the unit's training state is written, its model is not
    "between state and model": (state, "save", lambda model, folder, **k: "step-0000004" in str(folder)),
    # the unit is complete, the run folder still names the previous one
    "between the unit and the run folder's links": (state, "link", lambda source, target: "step-0000004" in
                                                    str(source) and target.name == TRAIN_STATE_FILE),
    "between the two links": (state, "link", lambda source, target: "step-0000004" in str(source)
                              and target.parent.name == "last"),
    # the unit names step 2 the best, best/ was not written yet
    "just before the best record": (engine, "link", lambda source, target: target.parent.name == "best"),
    "before result.json": (lra_train, "atomic_write", lambda path, write: path.name == "result.json"),
}


@pytest.mark.slow
@pytest.mark.parametrize("window", list(KILLS))
def test_a_kill_in_any_window_then_the_same_command_gives_the_uninterrupted_run(window, tmp_path, monkeypatch,
                                                                                uninterrupted):
    module, name, when = KILLS[window]
    restore = _kill_once(monkeypatch, module, name, when)
    folder = tmp_path / "seed0"
    with pytest.raises(Kill):
        train_seed(_cfg(), lra_splits(), 0, folder, progress=False)
    restore()
    assert not (folder / "result.json").exists()
    train_seed(_cfg(), lra_splits(), 0, folder, progress=False)
    _assert_same_run(folder, uninterrupted)


@pytest.mark.slow
def test_a_torn_metrics_line_is_dropped_with_a_warning_naming_the_file(tmp_path, monkeypatch, uninterrupted):
    restore = _kill_once(monkeypatch, engine._Training, "save", lambda run, *a: run.step == 4)
    folder = tmp_path / "seed0"
    with pytest.raises(Kill):
        train_seed(_cfg(), lra_splits(), 0, folder, progress=False)
    restore()
    with open(folder / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 5, "train_lo')  # a kill while appending
    with pytest.warns(UserWarning, match=r"metrics\.jsonl: dropped its last line, half-written"):
        train_seed(_cfg(), lra_splits(), 0, folder, progress=False)
    _assert_same_run(folder, uninterrupted)


@pytest.mark.slow
def test_a_model_and_state_of_different_steps_are_refused_in_one_line(tmp_path, monkeypatch):
    restore = _kill_once(monkeypatch, engine._Training, "save", lambda run, *a: run.step == 6)
    folder = tmp_path / "seed0"
    with pytest.raises(Kill):
        train_seed(_cfg(), lra_splits(), 0, folder, progress=False)
    restore()
    newest, older = (folder / CHECKPOINTS_DIR / f"step-{s:07d}" for s in (4, 2))
    shutil.copyfile(older / TRAIN_STATE_FILE, newest / TRAIN_STATE_FILE)
    with pytest.raises(ValueError) as err:
        train_seed(_cfg(), lra_splits(), 0, folder, progress=False)
    message = str(err.value)
    assert "\n" not in message and "is at step 2 but" in message and "at step 4" in message
    assert str(newest / TRAIN_STATE_FILE) in message


class _Payload:
    """Unpickling this calls open(marker, "w") (pickled under open.__module__, io.open on Python 3.11; the name is read, not assumed): a file appears if the state's code runs."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_training_state_that_would_run_code_is_refused_and_nothing_runs(tmp_path, monkeypatch):
    live = tmp_path / "live-marker"
    pickle.loads(pickle.dumps(_Payload(live))).close()  # the payload works when unpickled freely
    assert live.exists()

    restore = _kill_once(monkeypatch, engine._Training, "save", lambda run, *a: run.step == 4)
    folder = tmp_path / "seed0"
    with pytest.raises(Kill):
        train_seed(_cfg(), lra_splits(), 0, folder, progress=False)
    restore()
    marker = tmp_path / "marker"
    newest = folder / CHECKPOINTS_DIR / "step-0000002" / TRAIN_STATE_FILE
    good = torch.load(newest, weights_only=True)
    torch.save({**good, "payload": _Payload(marker)}, newest)
    with pytest.raises(ValueError) as err:
        train_seed(_cfg(), lra_splits(), 0, folder, progress=False)
    message = str(err.value)
    assert not marker.exists()
    assert "\n" not in message and f"refused {newest}: it holds {open.__module__}.open, which is not data" in message
    assert "nothing in it was run" in message


@pytest.mark.slow
def test_compiled_training_gives_the_eager_weights(tmp_path, monkeypatch):
    # Inductor takes minutes on a CPU: the engine's compile path runs with dynamo's eager backend
    # (the same graph capture, executed op by op), which must reproduce the uncompiled run exactly.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    compiled = train_seed(_cfg(compile=True, positional="ape"), lra_splits(), 0, tmp_path / "c", progress=False)
    eager = train_seed(_cfg(positional="ape"), lra_splits(), 0, tmp_path / "e", progress=False)
    assert _without_seconds(compiled) == _without_seconds(eager)
    a, b = _weights(tmp_path / "c", "last"), _weights(tmp_path / "e", "last")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["torch.compile", "first step"])
def test_compile_failures_fall_back_with_a_message_and_train_as_eager(where, tmp_path, monkeypatch):
    def unavailable(model, **kwargs):
        raise RuntimeError("no C compiler")

    class Broken(torch.nn.Module):  # compiles, then fails when first called (as inductor does)
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *args, **kwargs):
            kwargs["generator"].manual_seed(123)  # it drew from the code generator before failing
            raise RuntimeError("inductor: no C compiler")

    monkeypatch.setattr(torch, "compile", unavailable if where == "torch.compile" else Broken)
    with pytest.warns(RuntimeWarning, match=r"--compile: .*RuntimeError: .*no C compiler.*uncompiled"):
        compiled = train_seed(_cfg(compile=True), lra_splits(), 0, tmp_path / "c", progress=False)
    eager = train_seed(_cfg(), lra_splits(), 0, tmp_path / "e", progress=False)
    assert _without_seconds(compiled) == _without_seconds(eager)


def test_the_new_lra_flags_reach_the_configuration(tmp_path, monkeypatch):
    import spe.lab.lra as lra

    seen = {}

    def fake_run(cfg, seeds, out, **kwargs):
        seen["cfg"] = cfg
        (out.mkdir(parents=True, exist_ok=True), (out / "results.md").write_text("table\n"))
        return {"mean": 1.0, "std": 0.0}

    monkeypatch.setattr(lra, "run_lra", fake_run)
    assert main(["-q", "lra", "--task", "text", "--out", str(tmp_path), "--precision", "bf16", "--tensorboard",
                 "--keep-checkpoints", "3", "--compile"]) == 0
    cfg = seen["cfg"]
    assert (cfg.precision, cfg.tensorboard, cfg.keep_checkpoints, cfg.compile) == ("bf16", True, 3, True)
    assert main(["-q", "lra", "--task", "text", "--out", str(tmp_path)]) == 0
    cfg = seen["cfg"]
    assert (cfg.precision, cfg.tensorboard, cfg.keep_checkpoints, cfg.compile) == ("fp32", False, 2, False)


def test_options_that_only_change_how_a_run_is_carried_out_may_change_between_reruns(tmp_path, monkeypatch):
    import spe.lab.lra.data.tasks as tasks

    from spe.lab.lra import run_lra

    monkeypatch.setattr(tasks, "load_task", lambda *a, **k: lra_splits())
    first = run_lra(_cfg(steps=2), [0], tmp_path, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = run_lra(_cfg(steps=2, keep_checkpoints=1, compile=False, tensorboard=False), [0], tmp_path,
                        progress=False)
    assert again["results"] == first["results"]
    with pytest.raises(ValueError, match="another LRA experiment .*precision 'fp32' -> 'bf16'"):
        run_lra(_cfg(steps=2, precision="bf16"), [0], tmp_path, progress=False)
