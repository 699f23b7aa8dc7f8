"""run_status: one answer to "new, resumable or finished, and what differs" for train, demo and sweep."""

import json

from safetensors.torch import save_file

from spe.checkpoint import MODEL_FILE, TRAIN_STATE_FILE
from spe.lab.music.config import TrainConfig
from spe.lab.music.status import run_status

MODEL = {"positional": "ape", "d_model": 16, "num_layers": 1, "num_heads": 2, "d_ff": 32}


def _fake_checkpoint(out, cfg: TrainConfig, *, step: int, drop: tuple[str, ...] = ()):
    """A checkpoint header as `spe train` writes it (no real weights needed), minus the ``drop`` keys."""
    import torch

    config = {**cfg.model_config(vocab_size=50).to_dict()}
    for key in drop:  # a checkpoint written before these options existed
        config.pop(key)
    meta = {"step": step, "train": cfg.to_dict()}
    out.mkdir(parents=True, exist_ok=True)
    save_file({"x": torch.zeros(1)}, str(out / MODEL_FILE),
              metadata={"spe_config": json.dumps(config), "spe_metadata": json.dumps(meta)})


def test_new_resume_and_finished(tmp_path):
    cfg = TrainConfig(out=str(tmp_path / "run"), steps=4, seq_len=32, model=MODEL)
    status = run_status(cfg)
    assert (status.state, status.step, status.differences, status.has_train_state) == ("new", None, {}, False)
    _fake_checkpoint(tmp_path / "run", TrainConfig(**{**cfg.to_dict(), "steps": 2}), step=2)
    status = run_status(cfg)
    assert (status.state, status.step, status.differences) == ("resume", 2, {})
    (tmp_path / "run" / TRAIN_STATE_FILE).write_bytes(b"")
    assert run_status(cfg).has_train_state
    cfg.steps = 2
    assert run_status(cfg).state == "finished"


def test_differences_are_named_with_defaults_filled_in(tmp_path):
    cfg = TrainConfig(out=str(tmp_path / "run"), steps=4, seq_len=32, model=MODEL)
    # Options missing from an old header take their defaults: nothing differs.
    _fake_checkpoint(tmp_path / "run", cfg, step=4, drop=("code_noise", "attention_window", "gate_init"))
    assert run_status(cfg).differences == {}
    asked = TrainConfig(out=cfg.out, steps=4, seq_len=64, model={**MODEL, "d_ff": 48})
    status = run_status(asked)
    assert status.model_differences == {"d_ff": (32, 48)}
    assert status.train_differences == {"seq_len": (32, 64)}
    assert status.describe() == "d_ff 32 -> 48, seq_len 32 -> 64"
    # The vocabulary is compared only when the caller knows it (the tokenizer is checked on its own).
    assert run_status(cfg, vocab_size=60).model_differences == {"vocab_size": (50, 60)}
