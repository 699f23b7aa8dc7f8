"""Shared test helpers: a tiny MIDI corpus and training configuration (music and LRA, seconds a run),
torchrun with 2 gloo processes, a stand-in for SIGKILL and checkpoint comparisons."""

import itertools
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import write_midi
from safetensors.torch import load_file

from spe.checkpoint import MODEL_FILE
from spe.lab.lra.data.dataset import PairDataset, SequenceDataset
from spe.lab.lra import LRAConfig
from spe.lab.music.config import TrainConfig

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

_HOLD = ("import sys, time\nfrom spe.lab.engine.run_folder import run_lock\nwith run_lock(sys.argv[1]):\n"
         "    print('locked', flush=True)\n    time.sleep(120)\n")


def hold_lock(folder: Path):
    """A child process holding ``folder``'s run lock until killed (``proc.send_signal(SIGKILL)``)."""
    proc = subprocess.Popen([PYTHON, "-c", _HOLD, str(folder)], stdout=subprocess.PIPE, env=subprocess_env(), text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def rewrite_header(source: Path, target: Path, **changes) -> Path:
    """A copy of the checkpoint ``source`` in the folder ``target`` with header entries replaced
    (``config``: a dict of changes to spe_config; ``metadata``: to spe_metadata; others: whole entries)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(source), framework="pt") as f:
        header = dict(f.metadata())
    for key, entry in (("config", "spe_config"), ("metadata", "spe_metadata")):
        if key in changes:
            header[entry] = json.dumps({**json.loads(header[entry]), **changes.pop(key)})
    header.update(changes)
    target.mkdir(parents=True, exist_ok=True)
    save_file(load_file(str(source)), str(target / "model.safetensors"), metadata=header)
    return target


class Kill(BaseException):
    """Stands for SIGKILL at one moment: nothing after it runs (not an Exception, so nothing catches it)."""


def same_weights(a: Path, b: Path) -> bool:
    """Whether the run folders (or checkpoints) ``a`` and ``b`` hold bit-identical model weights."""
    wa, wb = load_file(str(a / MODEL_FILE)), load_file(str(b / MODEL_FILE))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def records(run: Path) -> list[dict]:
    """The records of ``run``'s metrics.jsonl, in order."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


needs_gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is unavailable")

# Tolerance of the 2-process losses against the 1-process ones, relative. The two runs differ
# only in float32 summation order: one process averages the cross-entropy over all B·L tokens,
# two average over B·L/2 each and DDP averages their gradients. Each such sum carries a relative
# rounding of a few units of float32's u = 6e-8 (pairwise sums: ~log2(B·L) u ≈ 7u ≈ 4e-7 here).
# AdamW passes a relative change of the gradient through to the update at the same relative
# size (m/√v, for gradients well above eps = 1e-8), so after N steps the weights, hence the
# loss, differ by about N × 4e-7 relative if nothing amplifies it; 6 steps give 2.4e-6. We allow
# 1e-5 (4× that, for amplification by the tiny model's curvature over 6 steps). Measured:
# 7e-8 at most, i.e. the first step's difference, which is the loss reduction's rounding alone.
RTOL = 1e-5


def free_port() -> int:
    """A TCP port free on 127.0.0.1 at the time of the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(cfg: TrainConfig, toml: Path, *extra: str) -> subprocess.CompletedProcess:
    """``spe train`` on ``cfg`` (written to ``toml``) in 2 gloo processes on loopback; asserts it succeeds."""
    toml.write_text(toml_text(cfg))
    command = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
               "-m", "spe", "-q", "train", "--config", str(toml), "--no-progress", *extra]
    done = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# The LRA classifier's tiny model: every encoding's options set small.
TINY_LRA_MODEL = {"d_model": 16, "num_heads": 2, "num_layers": 1, "d_ff": 16, "num_realizations": 8, "num_sines": 2,
                  "kernel_size": 3, "num_features": 8, "gated": True, "dropout": 0.0}


def _sequences(n, length, vocab, classes, seed, grid=None):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.full((n,), length) if grid else torch.randint(2, length + 1, (n,), generator=g)
    tokens = torch.randint(2, vocab, (n, length), generator=g)
    tokens[torch.arange(length)[None] >= lengths[:, None]] = 0
    return tokens, lengths, torch.randint(0, classes, (n,), generator=g)


def lra_dataset(task: str, n: int = 12, seed: int = 0):
    """``n`` random examples shaped like the LRA ``task``'s (lengths 7-16, its vocabulary and classes)."""
    if task == "retrieval":
        t1, l1, y = _sequences(n, 9, 258, 2, seed)
        t2, l2, _ = _sequences(n, 7, 258, 2, seed + 1)
        return PairDataset(t1, l1, t2, l2, y, vocab_size=258, num_classes=2)
    if task == "image":
        return SequenceDataset(*_sequences(n, 16, 258, 10, seed, grid=(4, 4)), vocab_size=258, num_classes=10,
                               grid=(4, 4))
    vocab, classes = (19, 10) if task == "listops" else (258, 2)
    return SequenceDataset(*_sequences(n, 10, vocab, classes, seed), vocab_size=vocab, num_classes=classes)


def tiny_lra_config(**overrides):
    """An LRAConfig of the tiny model on the text task (4 steps, a validation every 2), ``overrides`` applied."""
    values = dict(task="text", positional="sinespe", attention="performer", steps=4, batch_size=4, eval_every=2,
                  eval_batch_size=8, model=TINY_LRA_MODEL)
    return LRAConfig(**{**values, **overrides})


def lra_splits() -> dict:
    """Train (16), validation (8) and test (8) splits of random text-task examples."""
    return {"train": lra_dataset("text", 16, 0), "val": lra_dataset("text", 8, 1), "test": lra_dataset("text", 8, 2)}


def table_rows(text: str, *keys: str) -> dict:
    """The rows of every Markdown table in ``text`` as {header: cell} dicts (cells stripped), keyed by
    their cells in the columns ``keys`` (a tuple; one key: the cell itself; no key: the first column)."""
    lines = text.splitlines()
    rows = {}
    for i, line in enumerate(lines[:-1]):
        if not (line.startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip())):
            continue
        header = _cells(line)
        for row_line in itertools.takewhile(lambda s: s.startswith("|"), lines[i + 2:]):
            row = dict(zip(header, _cells(row_line), strict=True))
            key = tuple(row[k] for k in keys) if keys else (row[header[0]],)
            rows[key[0] if len(key) == 1 else key] = row
    return rows


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]
