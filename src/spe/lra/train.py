"""Training one LRA classifier (one seed): AdamW, warmup + decay, clipping, the best checkpoint.

A seed's folder holds:

* ``last/model.safetensors`` + ``train_state.pt``: the latest resumable state (optimizer,
  step, random streams, best accuracy so far), written at every validation;
* ``best/model.safetensors``: the weights of highest validation accuracy (metadata: step,
  ``val_accuracy``), written atomically whenever validation improves;
* ``metrics.jsonl``: one record per validation (step, training loss, val accuracy, seconds);
* ``result.json``: written last, after the test evaluation of the best checkpoint: a seed
  with a result is finished and is skipped when the experiment is run again.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import torch

from spe.checkpoint import MODEL_FILE, TRAIN_STATE_FILE, atomic_write, load, save
from spe.data.lra.dataset import PairDataset, SequenceDataset
from spe.lra.config import LRAConfig
from spe.lra.evaluate import accuracy, model_inputs
from spe.models.classifier_config import ClassifierConfig
from spe.models.encoder_classifier import EncoderClassifier
from spe.models.loss import cross_entropy

__all__ = ["RESULT_FILE", "build_classifier", "learning_rate_factor", "make_optimizer", "train_seed", "training_step"]

log = logging.getLogger(__name__)

RESULT_FILE = "result.json"


def build_classifier(cfg: LRAConfig, train: SequenceDataset | PairDataset) -> EncoderClassifier:
    """The classifier of ``cfg`` sized for the data (vocabulary, classes, grid, positions).

    Raises:
        ValueError: as :class:`~spe.models.ClassifierConfig` (unknown or impossible choices).
    """
    pair = isinstance(train, PairDataset)
    length = train.tokens1.shape[1] if pair else train.tokens.shape[1]
    model = dict(cfg.model)
    if pair and model.get("interaction") in (None, "none"):
        model["interaction"] = "nli"
    if not pair:
        model["interaction"] = None
    if cfg.num_realizations is not None:
        model["num_realizations"] = cfg.num_realizations
    grid = getattr(train, "grid", None)
    config = ClassifierConfig(vocab_size=train.vocab_size, num_classes=train.num_classes, positional=cfg.positional,
                              attention=cfg.attention, grid=grid, max_positions=length + 1, **model)
    return EncoderClassifier(config)


def learning_rate_factor(step: int, cfg: LRAConfig) -> float:
    """lr(step) / lr: linear warmup, then cosine decay to 0 or LRA's sqrt(warmup / step)."""
    warmup = max(cfg.warmup_steps, 1)
    if step < cfg.warmup_steps:
        return (step + 1) / warmup
    if cfg.schedule == "rsqrt":
        return math.sqrt(warmup / (step + 1))
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def training_step(model: EncoderClassifier, optimizer: torch.optim.Optimizer, train: SequenceDataset | PairDataset,
                  index: torch.Tensor, cfg: LRAConfig, *, generator: torch.Generator | None = None) -> float:
    """One AdamW step on examples ``index`` (cross-entropy, gradient clipped at ``cfg.grad_clip``).

    Returns:
        The batch's mean cross-entropy (nats) before the step.
    """
    inputs, labels = model_inputs(train, index, cfg.device)
    loss = cross_entropy(model(*inputs, generator=generator), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    return float(loss.detach())


def make_optimizer(model: EncoderClassifier, cfg: LRAConfig) -> torch.optim.Optimizer:
    """AdamW (β = 0.9, 0.98) with ``cfg.weight_decay`` on weight matrices only."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        # weight matrices of the attention, feed-forward and head decay; embeddings, norms,
        # biases and positional parameters (frequencies, filters, gates) do not
        matrix = p.dim() == 2 and not name.startswith(("embed", "ape", "encoding", "layer_encodings"))
        (decay if matrix else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98))


def _state(optimizer, step: int, best: dict, gens: dict[str, torch.Generator]) -> dict:
    return {"optimizer": optimizer.state_dict(), "step": step, "best": best, "torch_rng": torch.get_rng_state(),
            **{f"{k}_gen": g.get_state() for k, g in gens.items()}}


def _resume(folder: Path, model, optimizer, gens: dict[str, torch.Generator]) -> tuple[int, dict]:
    """Restores an interrupted seed; returns (step, best record) or (0, empty) for a new one."""
    from safetensors.torch import load_file

    state_file = folder / TRAIN_STATE_FILE
    if not state_file.is_file():
        return 0, {}
    try:
        ts = torch.load(state_file, weights_only=False)
        model.load_state_dict(load_file(str(folder / "last" / MODEL_FILE)))
    except Exception as err:  # noqa: BLE001 - a damaged run folder is a user-facing error
        raise ValueError(f"cannot resume {folder}: {err} (delete the folder to start this seed again)") from None
    optimizer.load_state_dict(ts["optimizer"])
    torch.set_rng_state(ts["torch_rng"])
    for k, g in gens.items():
        g.set_state(ts[f"{k}_gen"])
    metrics = folder / "metrics.jsonl"
    if metrics.exists():  # keep the records the resumed state has seen
        kept = [line for line in metrics.read_text().splitlines() if line and json.loads(line)["step"] <= ts["step"]]
        metrics.write_text("".join(line + "\n" for line in kept))
    log.info("resuming %s at step %d", folder, ts["step"])
    return ts["step"], ts["best"]


def _validate(model, splits, cfg: LRAConfig, folder: Path, step: int, best: dict, loss: float, t0: float) -> dict:
    val = accuracy(model, splits["val"], batch_size=cfg.eval_batch_size, limit=cfg.eval_examples,
                   device=cfg.device)
    record = {"step": step, "train_loss": loss, "val_accuracy": val, "seconds": time.time() - t0}
    with open(folder / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    if not best or val > best["val_accuracy"]:
        best = {"step": step, "val_accuracy": val}
        save(model, folder / "best", metadata={**best, "lra": cfg.to_dict()})
    return best


def train_seed(cfg: LRAConfig, splits: dict, seed: int, folder: str | Path, *, progress: bool = True) -> dict:
    """Trains one seed, keeps its best validation checkpoint, evaluates it on the test split.

    Resumable: an interrupted seed continues from its last validation; a finished one
    (``result.json`` present) is returned as it is.

    Args:
        cfg: the experiment.
        splits: ``{"train", "val", "test"}`` from :func:`spe.data.lra.load_task`.
        seed: seeds the initialisation, the batches, the SPE codes and dropout.
        folder: the seed's folder (created).
        progress: show a tqdm bar.

    Returns:
        The result record: ``seed``, ``test_accuracy``, ``val_accuracy``, ``best_step``,
        ``steps``, ``seconds`` (training + evaluation wall time, summed over resumptions).
    """
    folder = Path(folder)
    if (folder / RESULT_FILE).is_file():
        return json.loads((folder / RESULT_FILE).read_text())
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = build_classifier(cfg, splits["train"]).to(cfg.device)
    optimizer = make_optimizer(model, cfg)
    gens = {"data": torch.Generator().manual_seed(seed), "code": torch.Generator().manual_seed(seed + 1)}
    step, best = _resume(folder, model, optimizer, gens)
    elapsed = best.get("seconds", 0.0)
    t0 = time.time() - elapsed
    _loop(cfg, model, optimizer, gens, splits, folder, step, best, t0, progress)
    best = json.loads((folder / "best.json").read_text())
    model = load(folder / "best", device=cfg.device)
    test = accuracy(model, splits["test"], batch_size=cfg.eval_batch_size, device=cfg.device)
    result = {"seed": seed, "test_accuracy": test, "val_accuracy": best["val_accuracy"], "best_step": best["step"],
              "steps": cfg.steps, "seconds": time.time() - t0, "num_parameters": model.num_parameters()}
    atomic_write(folder / RESULT_FILE, lambda tmp: Path(tmp).write_text(json.dumps(result, indent=2)))
    return result


def _loop(cfg, model, optimizer, gens, splits, folder: Path, step: int, best: dict, t0: float,
          progress: bool) -> None:
    from tqdm.auto import tqdm

    train = splits["train"]
    model.train()
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc=folder.name, leave=False)
    running = None
    while step < cfg.steps:
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * learning_rate_factor(step, cfg)
        index = torch.randint(len(train), (cfg.batch_size,), generator=gens["data"])
        value = training_step(model, optimizer, train, index, cfg, generator=gens["code"])
        step += 1
        running = value if running is None else 0.95 * running + 0.05 * value
        bar.update(1)
        bar.set_postfix(loss=f"{running:.3f}", best=f"{best.get('val_accuracy', 0):.3f}")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            best = _validate(model, splits, cfg, folder, step, best, running, t0)
            best["seconds"] = time.time() - t0
            save(model, folder / "last", metadata={"step": step})
            state = _state(optimizer, step, best, gens)
            atomic_write(folder / TRAIN_STATE_FILE, lambda tmp: torch.save(state, tmp))
            atomic_write(folder / "best.json", lambda tmp: Path(tmp).write_text(json.dumps(best)))
    bar.close()
