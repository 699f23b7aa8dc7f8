"""The end-to-end demo (``spe demo``): train each positional encoding, evaluate them together,
generate a piece with the first."""

from __future__ import annotations

import time
from pathlib import Path

from spe.lab import strict_json
from spe.checkpoint import load
from spe.lab.music.evaluation.checkpoints import evaluate_checkpoints
from spe.lab.music.generation import generate_midi
from spe.lab.labels import run_label
from spe.lab.music.config import TrainConfig
from spe.lab.music.train import train
from spe.lab.music.status import run_status

__all__ = ["run_demo", "train_or_reuse"]


def train_or_reuse(cfg: TrainConfig, *, progress: bool = True) -> None:
    """Trains ``cfg`` into ``cfg.out``, resumes it, or does nothing if that run is finished.

    Raises:
        ValueError: if ``cfg.out`` holds a run with another configuration (the keys are named).
    """
    status = run_status(cfg)
    if status.state != "new" and status.differences:
        raise ValueError(f"{status.out} holds a run with another configuration ({status.describe()}); "
                         "choose another --out or delete it")
    if status.state != "finished":
        train(cfg, resume=status.state == "resume", progress=progress)


def run_demo(configs: list[TrainConfig], out: str | Path, *, max_length: int | None, length: int, seed: int,
             data: str | None = None, cache_dir: str | None = None, device: str = "cpu",
             progress: bool = True) -> dict:
    """Trains (or reuses) one run per configuration, evaluates them together, generates with the first.

    Args:
        configs: one training configuration per model, each with its own ``out``.
        out: demo folder: ``evaluation/``, ``generated.mid``, ``demo.json``.
        max_length: evaluated positions (default 3 × the training length).
        length: tokens generated.
        seed: sampling seed.
        data: evaluation data (default: the first run's).
        cache_dir: corpus cache.
        device: where evaluation and generation run.
        progress: progress bars.

    Returns:
        ``{"timings_s": {step: seconds}, "generated": generate_midi's facts, "summary":
        evaluate_models's summary}``; ``demo.json`` holds timings, facts and the summary's path.
    """
    out = Path(out)
    t0 = time.perf_counter()
    timings, checkpoints = {}, []
    for cfg in configs:
        t = time.perf_counter()
        train_or_reuse(cfg, progress=progress)
        timings[f"train {run_label(cfg.model)}"] = time.perf_counter() - t
        checkpoints.append(cfg.out)
    t = time.perf_counter()
    loaded = [load(c, device=device) for c in checkpoints]
    summary = evaluate_checkpoints(loaded, out / "evaluation", max_length=max_length, data=data, cache_dir=cache_dir,
                                   batch_size=8, device=device, json_path=None, progress=progress)
    timings["evaluate"] = time.perf_counter() - t
    t = time.perf_counter()
    info = generate_midi(loaded[0], str(out / "generated.mid"), length=length, prompt=None, prompt_bars=2,
                         seed=seed, top_p=0.9, temperature=1.2, progress=progress)
    timings["generate"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0
    (out / "demo.json").write_text(strict_json.dumps({"timings_s": timings, "generated": info,
                                                      "evaluation": str(out / "evaluation" / "summary.json")},
                                                     indent=2))
    return {"timings_s": timings, "generated": info, "summary": summary}
