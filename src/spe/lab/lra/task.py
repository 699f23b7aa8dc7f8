"""The Long Range Arena classifier as a task of the training engine (``spe lra``, one seed).

Batches of B examples drawn uniformly with replacement (``torch.randint`` on the ``data``
generator; under ``torchrun`` each process takes its B / N slice), each cut to its longest
sequence; cross-entropy of the class; validation accuracy at every evaluation, the highest
marking the best checkpoint (``best/``). Letters: B = batch, L = length, K = classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from spe.checkpoint import load_metadata
from spe.lab.lra.data.dataset import PairDataset, SequenceDataset
from spe.lab.lra.config import LRAConfig
from spe.lab.lra.evaluate import correct_count, model_inputs
from spe.models.classifier_config import ClassifierConfig
from spe.models.encoder_classifier import EncoderClassifier
from spe.models.loss import cross_entropy
from spe.lab.engine import distributed as dist_
from spe.lab.engine.state import latest_unit
from spe.lab.engine.data_check import check_data, data_record
from spe.lab.engine.task import EngineSettings, RunLayout, StepStats

__all__ = ["LRATask", "build_classifier", "engine_settings"]


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


def engine_settings(cfg: LRAConfig, seed: int) -> EngineSettings:
    """The engine options of one seed of an LRA experiment: its options of the same names, the
    seed, and ``units_per_example = 1`` (the progress rate counts examples)."""
    return EngineSettings.from_options(cfg, seed=seed, units_per_example=1)


@dataclass
class LRATask:
    """One seed of an LRA experiment (see the module docstring).

    Args:
        cfg: the experiment.
        splits: ``{"train", "val", "test"}`` from :func:`spe.lab.lra.data.load_task`.
        label: the progress bar's description (the seed's folder name).
        folder: the seed's folder, whose newest checkpoint a resume compares the data with
            (None: not compared).
    """

    cfg: LRAConfig
    splits: dict
    label: str = "lra"
    kind: str = "lra"
    folder: Path | None = None
    generators: tuple[str, ...] = ("data", "code")
    layout: RunLayout = field(default_factory=lambda: RunLayout(latest="last", best="best"))
    best_metric: str | None = "val_accuracy"
    data: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The redraws' own stream, only where there are redraws: a run without them keeps the
        # generators (and so the resume state) it always had.
        if self.cfg.feature_redraw_every and "feature" not in self.generators:
            self.generators = (*self.generators, "feature")

    def prepare(self, ctx: dist_.Distributed, *, resume: bool) -> None:
        """Nothing to load (the splits are given); a resumed seed must find the data it started on.

        Raises:
            ValueError: if ``folder``'s newest checkpoint was trained on other splits (unless
                ``cfg.allow_data_change``: then a warning).
        """
        self.data = data_record(**{name: self.splits[name] for name in ("train", "val", "test")})
        unit = latest_unit(self.folder, self.layout.latest) if resume and self.folder is not None else None
        if unit is not None:
            check_data(load_metadata(unit.model).get("data"), self.data, where=f"the data of {self.folder}",
                       unit="examples", allow_change=self.cfg.allow_data_change,
                       hint=f"restore it, or delete {self.folder} to train that seed again")

    def build_model(self) -> EncoderClassifier:
        return build_classifier(self.cfg, self.splits["train"])

    def batch(self, gens: dict[str, torch.Generator], ctx: dist_.Distributed, device: torch.device):
        """``(inputs, labels)`` of this process's slice of B examples (inputs as the model takes them)."""
        train = self.splits["train"]
        index = torch.randint(len(train), (self.cfg.batch_size,), generator=gens["data"])  # (B,)
        return model_inputs(train, dist_.shard(index, ctx), device)

    def loss(self, model, batch, gens: dict[str, torch.Generator]) -> torch.Tensor:
        inputs, labels = batch
        return cross_entropy(model(*inputs, generator=gens["code"]), labels)  # (B, K) logits

    def evaluate(self, model: EncoderClassifier, ctx: dist_.Distributed, device: torch.device) -> dict:
        """``val_accuracy`` in [0, 1] on the first ``eval_examples`` validation examples (0: all)."""
        correct, n = correct_count(model, self.splits["val"], batch_size=self.cfg.eval_batch_size,
                                   limit=self.cfg.eval_examples, device=device, ctx=ctx)
        return {"val_accuracy": correct / n if n else 0.0}

    def record(self, stats: StepStats, evaluation: dict | None) -> dict | None:
        """At evaluations only: step, running training loss (nats), validation accuracy, seconds."""
        if evaluation is None:
            return None
        return {"step": stats.step, "train_loss": stats.running_loss, "val_accuracy": evaluation["val_accuracy"],
                "seconds": stats.seconds}

    def metadata(self, step: int, evaluation: dict | None) -> dict:
        return {"step": step, "val_accuracy": (evaluation or {}).get("val_accuracy"), "lra": self.cfg.to_dict(),
                "data": self.data}
