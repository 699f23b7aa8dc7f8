"""A tiny corpus and a tiny training configuration for training, CLI and evaluation tests (seconds a run)."""

import os
import sys
from pathlib import Path

from conftest import write_midi

from spe.lab.train.config import TrainConfig

# Dropout and feature redraws on, so that resuming must restore the global RNG and the feature generator.
TINY_MODEL = {"d_model": 32, "num_layers": 1, "num_heads": 2, "d_ff": 64, "num_realizations": 4,
              "num_features": 16, "dropout": 0.1}
TINY = {"seq_len": 32, "batch_size": 4, "steps": 6, "lr": 3e-3, "warmup_steps": 2, "eval_every": 2,
        "max_transpose": 2, "threads": 1, "feature_redraw_every": 3}
SRC = str(Path(__file__).resolve().parents[1] / "src")


def clean_midi(root: Path, pieces: int = 6) -> Path:
    """``pieces`` readable MIDI files of 240-440 REMI tokens in ``root`` (5 % held out, at least one)."""
    for i in range(pieces):
        write_midi(root / f"piece{i}.mid", seed=i, notes=60 + 10 * i)
    return root


def tiny_config(tmp_path: Path, name: str, *, model: dict | None = None, **overrides) -> TrainConfig:
    """The tiny model on ``tmp_path/clean_midi`` (written if missing), out = tmp_path / name."""
    data = tmp_path / "clean_midi"
    if not data.is_dir():
        clean_midi(data)
    return TrainConfig(**{**TINY, "data": str(data), "cache_dir": str(tmp_path / "cache"),
                          "out": str(tmp_path / name), **overrides}, model={**TINY_MODEL, **(model or {})})


def toml_text(cfg: TrainConfig) -> str:
    """A config file holding ``cfg`` (None values left out: TOML has no null)."""
    def value(v):
        return f'"{v}"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else repr(v)

    options = cfg.to_dict()
    model = options.pop("model")
    return ("".join(f"{k} = {value(v)}\n" for k, v in options.items() if v is not None) + "\n[model]\n"
            + "".join(f"{k} = {value(v)}\n" for k, v in model.items() if v is not None))


def subprocess_env() -> dict:
    """The environment for ``python -m spe`` in a child process: this checkout first, one thread."""
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


PYTHON = sys.executable

_HOLD = ("import sys, time\nfrom spe.lab.train.run_folder import run_lock\nwith run_lock(sys.argv[1]):\n"
         "    print('locked', flush=True)\n    time.sleep(120)\n")


def hold_lock(folder: Path):
    """A child process holding ``folder``'s run lock until killed (``proc.send_signal(SIGKILL)``)."""
    import subprocess

    proc = subprocess.Popen([PYTHON, "-c", _HOLD, str(folder)], stdout=subprocess.PIPE, env=subprocess_env(), text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def rewrite_header(source: Path, target: Path, **changes) -> Path:
    """A copy of the checkpoint ``source`` in the folder ``target`` with header entries replaced
    (``config``: a dict of changes to spe_config; ``metadata``: to spe_metadata; others: whole entries)."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(source), framework="pt") as f:
        header = dict(f.metadata())
    for key, entry in (("config", "spe_config"), ("metadata", "spe_metadata")):
        if key in changes:
            header[entry] = json.dumps({**json.loads(header[entry]), **changes.pop(key)})
    header.update(changes)
    target.mkdir(parents=True, exist_ok=True)
    save_file(load_file(str(source)), str(target / "model.safetensors"), metadata=header)
    return target
