"""Training one LRA classifier (one seed) with the training engine, then testing its best checkpoint.

The loop is :func:`spe.lab.engine.core.run`'s; the task (batches, loss, validation accuracy)
is :class:`spe.lab.lra.task.LRATask`. A seed's folder holds:

* ``checkpoints/step-SSSSSSS/{model.safetensors, train_state.pt}``: the last
  ``keep_checkpoints`` checkpoint units (weights; optimizer, step, every random state, the
  best record), written at every validation;
* ``last/model.safetensors`` and ``train_state.pt``: links to the newest unit;
* ``best/model.safetensors``: the weights of highest validation accuracy (metadata: step,
  ``val_accuracy``, the experiment), a link to the unit of that step;
* ``metrics.jsonl``: one record per validation (step, running training loss, val accuracy, seconds);
* ``result.json``: written last, after the test evaluation of the best checkpoint: a seed
  with a result is finished and is skipped when the experiment is run again.

An interrupted seed resumes from its newest complete unit when the same command is run
again; the best record lives in the unit, so a kill at any moment leaves a seed that
finishes with the weights, best step and result of an uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from spe.checkpoint import atomic_write, load, load_metadata
from spe.lab.lra.config import LRAConfig
from spe.lab.lra.evaluate import correct_count
from spe.lab.lra.task import LRATask, engine_settings
from spe.lab.engine import distributed as dist_
from spe.lab.engine import core as engine
from spe.lab.engine.run_folder import run_lock

__all__ = ["RESULT_FILE", "train_seed"]

log = logging.getLogger(__name__)

RESULT_FILE = "result.json"


def train_seed(cfg: LRAConfig, splits: dict, seed: int, folder: str | Path, *, progress: bool = True) -> dict:
    """Trains one seed, keeps its best validation checkpoint, evaluates it on the test split.

    Resumable: an interrupted seed continues from its newest checkpoint unit; a finished one
    (``result.json`` present) is returned as it is. Under ``torchrun`` every process calls
    this with the same arguments; only rank 0 writes files.

    Args:
        cfg: the experiment.
        splits: ``{"train", "val", "test"}`` from :func:`spe.lab.lra.data.load_task`.
        seed: seeds the initialisation, the batches, the SPE codes and dropout.
        folder: the seed's folder (created).
        progress: show a tqdm bar.

    Returns:
        The result record: ``seed``, ``test_accuracy``, ``val_accuracy``, ``best_step``,
        ``steps``, ``seconds`` (training + evaluation wall time, summed over resumptions),
        ``num_parameters``.

    Raises:
        ValueError: as :func:`spe.lab.engine.core.run` (e.g. a checkpoint unit that cannot be
            resumed, a loss that became NaN).
    """
    folder = Path(folder)
    if (folder / RESULT_FILE).is_file():
        return json.loads((folder / RESULT_FILE).read_text())
    with dist_.session("cuda" if str(cfg.device).startswith("cuda") else "cpu") as ctx, run_lock(folder, ctx):
        if (folder / RESULT_FILE).is_file():  # finished by another process while this one waited
            return json.loads((folder / RESULT_FILE).read_text())
        outcome = engine.run(LRATask(cfg, splits, label=folder.name, folder=folder), engine_settings(cfg, seed), folder,
                             resume=True, progress=progress)
        started = time.perf_counter()
        device = dist_.process_device(cfg.device, ctx)
        model = load(folder / "best", device=device).model
        stored = load_metadata(folder / "best")
        if stored.get("step") != outcome.best["step"]:  # the engine repairs best/ on resume: a bug otherwise
            raise RuntimeError(f"{folder / 'best'} holds step {stored.get('step')}, the run's best is "
                               f"{outcome.best['step']}")
        correct, n = correct_count(model, splits["test"], batch_size=cfg.eval_batch_size, device=device, ctx=ctx)
        result = {"seed": seed, "test_accuracy": correct / n if n else 0.0,
                  "val_accuracy": outcome.best["val_accuracy"], "best_step": outcome.best["step"],
                  "steps": cfg.steps, "seconds": outcome.seconds + time.perf_counter() - started,
                  "num_parameters": model.num_parameters()}
        if ctx.is_main:
            atomic_write(folder / RESULT_FILE, lambda tmp: Path(tmp).write_text(json.dumps(result, indent=2)))
        dist_.barrier(ctx)
    return result
