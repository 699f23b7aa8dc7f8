"""``spe train``: the music language model trained by the engine (:mod:`spe.lab.engine.core`).

One process, or N processes under ``torchrun`` (``batch_size`` is the global batch, each
process trains on its slice); ``fp32``/``bf16``/``fp16`` (:mod:`spe.lab.engine.precision`);
checkpoints as :mod:`spe.lab.engine.state` describes; TensorBoard scalars on request. The task
(crops, loss, validation) is :class:`spe.lab.music.task.LMTask`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from spe.lab.engine import core as engine
from spe.lab.music.config import TrainConfig
from spe.lab.engine.core import TrainingDiverged
from spe.lab.music.task import LMTask, engine_settings
from spe.lab.music.validation import plot_losses

__all__ = ["TrainingDiverged", "train"]

log = logging.getLogger(__name__)


def train(cfg: TrainConfig, *, resume: bool = False, progress: bool = True, overwrite: bool = False) -> Path:
    """Trains a decoder LM on REMI tokens and writes ``cfg.out/model.safetensors``.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) each process calls this with the same ``cfg``:
    ``cfg.batch_size`` is the global batch (divisible by the number of processes) and only
    rank 0 writes files.

    Args:
        cfg: the training configuration.
        resume: continue from ``cfg.out`` (model, optimizer, step, random states).
        progress: show a progress bar (rank 0).
        overwrite: replace a previous run in ``cfg.out`` (its checkpoints, metrics, plots).

    Returns:
        The run folder.

    Raises:
        ValueError: on unusable data, a bad configuration, a run folder that holds another
            run, a resume that does not match (model, data, tokenizer, number of processes,
            or a checkpoint whose model and training state are from different steps), or a
            loss that became NaN (:class:`TrainingDiverged`; the last good checkpoint is kept).
    """
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    task = LMTask(cfg, overwrite=overwrite, progress=progress)
    outcome = engine.run(task, engine_settings(cfg), cfg.out, resume=resume, overwrite=overwrite,
                         progress=progress)
    if outcome.is_main:
        plot_losses(outcome.out / engine.METRICS_FILE, outcome.out / "loss.png")
    return outcome.out
