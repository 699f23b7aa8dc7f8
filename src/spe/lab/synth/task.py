"""A synthetic task (flip-flop, MQAR) as a task of the training engine (``spe synth``, one seed).

Every step draws B fresh sequences of the training length from the ``data`` generator
(seeded with the run's seed, :class:`~spe.lab.engine.task.EngineSettings`), so the training
stream is a pure function of the seed; the loss is the cross-entropy at the target positions
only (``targets`` −100 elsewhere). Every ``eval_every`` steps the accuracy on the fixed
validation split (in-distribution at the training length, its own seed) is recorded. The
model is the decoder LM (:class:`~spe.models.DecoderLM`). Letters: B = batch, T = length, V = vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from spe.lab.synth.config import SynthConfig
from spe.lab.synth.data import (FLIP_FLOP_DISTRIBUTIONS, IGNORE, MQAR_DISTRIBUTIONS, flip_flop, mqar,
                                split_seed)
from spe.lab.engine import distributed as dist_
from spe.lab.engine.precision import autocast
from spe.lab.engine.task import EngineSettings, RunLayout, StepStats
from spe.models.decoder_lm import DecoderLM
from spe.models.loss import cross_entropy

__all__ = ["SynthTask", "correct_count", "distributions", "draw", "engine_settings", "fixed_split",
           "training_distribution"]


def distributions(task: str) -> tuple[str, ...]:
    """The test distributions of ``task`` (flip-flop: in-distribution, sparse, dense; MQAR: more-pairs, same-pairs)."""
    return tuple(FLIP_FLOP_DISTRIBUTIONS) if task == "flip-flop" else MQAR_DISTRIBUTIONS


def training_distribution(task: str) -> str:
    """The distribution training draws from (and validation tests): flip-flop's own p(i), MQAR's N_L."""
    return "in-distribution" if task == "flip-flop" else "same-pairs"


def draw(cfg: SynthConfig, distribution: str, length: int, batch: int,
         generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """B sequences of T tokens of one of the task's distributions: ``tokens``, ``targets`` (B, T).

    Flip-flop: p(i) of the distribution (``in-distribution``: ``cfg.p_ignore``). MQAR:
    ``more-pairs`` has :meth:`SynthConfig.pairs_at` pairs, ``same-pairs`` N_L (at most T / 4).

    Raises:
        ValueError: on a distribution the task has not.
    """
    if distribution not in distributions(cfg.task):
        raise ValueError(f"{cfg.task} has the distributions {', '.join(distributions(cfg.task))}, "
                         f"got {distribution!r}")
    if cfg.task == "flip-flop":
        p = FLIP_FLOP_DISTRIBUTIONS[distribution]
        return flip_flop(batch, length, p_ignore=cfg.p_ignore if p is None else p, generator=generator)
    pairs = cfg.pairs_at(length) if distribution == "more-pairs" else min(cfg.train_pairs, length // 4)
    return mqar(batch, length, num_pairs=pairs, num_keys=cfg.num_keys, num_values=cfg.num_values,
                generator=generator)


def fixed_split(cfg: SynthConfig, split: str, distribution: str, length: int) -> tuple[Tensor, Tensor]:
    """The sequences of a fixed split: ``validation`` (``cfg.eval_examples`` at the training
    length, :meth:`SynthConfig.examples_at` beyond it, as a test split) or ``test``
    (:meth:`SynthConfig.examples_at`), drawn from the generator seeded with
    :func:`~spe.lab.synth.data.split_seed` ``(task, split, distribution, length, eval_seed)``:
    the same sequences for every run and every seed."""
    generator = torch.Generator().manual_seed(split_seed(cfg.task, split, distribution, length, cfg.eval_seed))
    at_l = split == "validation" and length == cfg.seq_len
    count = cfg.eval_examples if at_l else cfg.examples_at(length)
    return draw(cfg, distribution, length, count, generator)


@torch.no_grad()
def correct_count(model: DecoderLM, tokens: Tensor, targets: Tensor, *, batch_tokens: int, device: torch.device,
                  precision: str = "fp32", ctx: dist_.Distributed | None = None) -> tuple[int, int]:
    """(targets predicted exactly, targets): the argmax over the whole vocabulary at every target
    position of ``tokens`` (N, T), in batches of max(1, ``batch_tokens`` // T) sequences; under
    ``torchrun`` each process takes every N-th sequence and the counts are summed.

    The model is called as it is (callers put it in eval mode: one fixed SPE code, no dropout).
    """
    rank, world = (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)
    tokens, targets = tokens[rank::world], targets[rank::world]
    per = max(1, batch_tokens // tokens.shape[1])
    correct = total = 0
    for start in range(0, len(tokens), per):
        x, y = tokens[start:start + per].to(device), targets[start:start + per].to(device)
        with autocast(precision, device.type):
            predicted = model(x).argmax(dim=-1)  # (b, T)
        scored = y != IGNORE
        correct += int((predicted == y)[scored].sum())
        total += int(scored.sum())
    if ctx is not None:
        correct, total = (int(v) for v in dist_.all_sum([float(correct), float(total)], ctx, device))
    return correct, total


def engine_settings(cfg: SynthConfig, seed: int) -> EngineSettings:
    """The engine options of one seed: the experiment's options of the same names, the seed, and
    ``units_per_example = train_length`` (the progress rate counts tokens)."""
    return EngineSettings.from_options(cfg, seed=seed, units_per_example=cfg.seq_len)


@dataclass
class SynthTask:
    """One seed of a synthetic-task experiment (see the module docstring).

    Args:
        cfg: the experiment.
        label: the progress bar's description.
    """

    cfg: SynthConfig
    label: str = "synth"
    kind: str = "synth"
    generators: tuple[str, ...] = ("data", "code", "feature")
    layout: RunLayout = field(default_factory=lambda: RunLayout(latest="", best=None))
    best_metric: str | None = None
    validation: tuple[Tensor, Tensor] | None = None

    def prepare(self, ctx: dist_.Distributed, *, resume: bool) -> None:
        """Draws the fixed validation split."""
        self.validation = fixed_split(self.cfg, "validation", training_distribution(self.cfg.task),
                                      self.cfg.seq_len)

    def build_model(self) -> DecoderLM:
        return DecoderLM(self.cfg.model_config())

    def batch(self, gens: dict[str, torch.Generator], ctx: dist_.Distributed,
              device: torch.device) -> tuple[Tensor, Tensor]:
        """This process's slice of B fresh training sequences: ``tokens``, ``targets`` (B / N, L)."""
        tokens, targets = draw(self.cfg, training_distribution(self.cfg.task), self.cfg.seq_len,
                               self.cfg.batch_size, gens["data"])
        return dist_.shard(tokens, ctx).to(device), dist_.shard(targets, ctx).to(device)

    def loss(self, model, batch: tuple[Tensor, Tensor], gens: dict[str, torch.Generator]) -> Tensor:
        tokens, targets = batch
        return cross_entropy(model(tokens, generator=gens["code"]), targets)  # mean over the targets only

    def evaluate(self, model: DecoderLM, ctx: dist_.Distributed, device: torch.device) -> dict:
        """``val_accuracy`` in [0, 1]: the share of the validation targets predicted exactly."""
        correct, n = correct_count(model, *self.validation, batch_tokens=self.cfg.eval_batch_tokens, device=device,
                                   precision=self.cfg.precision, ctx=ctx)
        return {"val_accuracy": correct / n if n else 0.0}

    def record(self, stats: StepStats, evaluation: dict | None) -> dict:
        """Every step: step, loss (nats per target), lr, tokens/s; at evaluations also the
        validation accuracy and the run's seconds."""
        record = {"step": stats.step, "loss": stats.loss, "lr": stats.lr, "tokens_per_s": stats.units_per_s}
        if evaluation is None:
            return record
        return {**record, **evaluation, "seconds": stats.seconds}

    def metadata(self, step: int, evaluation: dict | None) -> dict:
        return {"step": step, "val_accuracy": (evaluation or {}).get("val_accuracy"), "synth": self.cfg.to_dict()}
