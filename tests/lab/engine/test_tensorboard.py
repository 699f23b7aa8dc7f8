"""--tensorboard: the scalars of metrics.jsonl as TensorBoard events; a clear message without the package."""

import json

import pytest
from tiny_run import tiny_config

from spe.lab.music.train import train


@pytest.mark.slow
def test_event_files_hold_the_metrics_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = train(tiny_config(tmp_path, "tb", steps=4, tensorboard=True), progress=False)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags == {"train/loss", "train/lr", "train/tokens_per_s", "val/ce_within", "val/ce_beyond"}
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert loss == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in records]
    within = [(e.step, e.value) for e in events.Scalars("val/ce_within")]
    assert within == [(r["step"], pytest.approx(r["val_loss"], rel=1e-6)) for r in records if "val_loss" in r]
    beyond = {e.step: e.value for e in events.Scalars("val/ce_beyond")}
    assert set(beyond) == {2, 4} and all(v > 0 for v in beyond.values())


def test_asking_without_the_package_says_how_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.split(".")[0] == "tensorboard":
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(ValueError, match=r"--tensorboard .*pip install 'spe\[log\]'"):
        train(tiny_config(tmp_path, "tb", tensorboard=True), progress=False)
    assert not (tmp_path / "tb").exists()  # refused before anything is written
