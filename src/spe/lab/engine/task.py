"""What the training engine (:mod:`spe.lab.engine.core`) asks of an experiment: a small task interface.

A task says what the model is, how a training batch is drawn from the run's explicit
generators, what the loss of a batch is, how the model is evaluated and which evaluation
metric makes a checkpoint "best". Everything else (optimizer, schedule, precision,
processes, checkpoints, metrics log, TensorBoard, progress bar) is the engine's.

The two tasks are the music language model (:class:`spe.lab.music.task.LMTask`, ``spe
train``) and the Long Range Arena classifier (:class:`spe.lab.lra.task.LRATask`, ``spe lra``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Protocol

import torch
from torch import nn

from spe.lab.options import ExperimentOptions, check_options
from spe.lab.engine.distributed import Distributed

__all__ = ["EngineSettings", "RunLayout", "StepStats", "Task"]


# The engine's fields: the run's seed, then every option ExperimentOptions marks ``engine`` (its
# type, default and rule, declared there once), then what one example counts for.
_EngineFields = make_dataclass(
    "_EngineFields",
    [("seed", int), *((f.name, f.type, field(default=f.default, metadata=f.metadata))
                      for f in fields(ExperimentOptions) if f.metadata.get("engine")),
     ("units_per_example", int, field(default=1))],
    frozen=True, namespace={"__module__": __name__})


@dataclass(frozen=True)
class EngineSettings(_EngineFields):
    """How the engine trains (the task-independent options of ``spe train`` and ``spe lra``).

    Every field but two is the option of :class:`~spe.lab.options.ExperimentOptions` marked
    ``engine`` (same name, type, default and rule; its meaning is documented there), so that an
    engine option is declared once; ``batch_size`` counts examples (crops, sequences, pairs) over
    all processes, and under ``torchrun`` with N processes each takes B / N of them (N must divide B).

    Attributes:
        seed: seeds the initialisation (``torch.manual_seed``) and the task's generators
            (generator k gets ``seed + k``).
        units_per_example: what one example counts for in the progress rate (tokens of a crop).
    """

    def __post_init__(self) -> None:
        # the one rule per option of spe train and spe lra, also for Python callers of the engine
        check_options(self.__dict__)

    @classmethod
    def from_options(cls, options: object, /, **fixed) -> EngineSettings:
        """The engine settings of an experiment's options: the one mapping of ``spe train`` and ``spe lra``.

        Every field is either read from ``options`` (the attribute of the same name) or given in
        ``fixed`` (what the configuration has not, or names otherwise: LRA's per-run ``seed``, the
        music's ``units_per_example = seq_len``), never both, and none is left to its default:
        an engine option added here must be taken up by every task, or building its settings fails.

        Args:
            options: a configuration (:class:`~spe.lab.music.config.TrainConfig`,
                :class:`~spe.lab.lra.config.LRAConfig`, any object with such attributes).
            fixed: values of the fields ``options`` has no attribute for.

        Raises:
            ValueError: naming the fields given both ways, or neither way; as the class for
                values outside an option's rule.
        """
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(fixed) - set(names))
        if unknown:
            raise ValueError(f"{unknown} are not engine settings; the settings are {', '.join(names)}")
        read = {name: getattr(options, name) for name in names if hasattr(options, name)}
        both = sorted(set(read) & set(fixed))
        missing = [name for name in names if name not in read and name not in fixed]
        kind = type(options).__name__
        if both:
            raise ValueError(f"{both}: {kind} has these options and they are given explicitly too; give each one way")
        if missing:
            raise ValueError(f"engine setting(s) {missing} are neither options of {kind} nor given explicitly: "
                             "add the option to the configuration or pass its value")
        return cls(**read, **fixed)


@dataclass(frozen=True)
class RunLayout:
    """Where a run folder keeps its files, beside ``checkpoints/step-SSSSSSS/`` and ``train_state.pt``.

    Attributes:
        latest: subfolder holding a link to the latest model ("": the run folder itself).
        best: subfolder holding a link to the best model, or None when the task tracks none.
        extra_files: other files of the run that ``overwrite`` removes (e.g. ``loss.png``).
    """

    latest: str = ""
    best: str | None = None
    extra_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepStats:
    """What the engine knows after an optimizer step, for the task's metrics record.

    Attributes:
        step: optimizer steps done.
        loss: this step's loss, mean over the global batch.
        running_loss: exponential moving average of the loss (weight 0.05 on the newest).
        lr: the learning rate of this step.
        units_per_s: ``units_per_example`` × examples per second since this process started.
        seconds: wall time of the run so far, summed over resumptions.
    """

    step: int
    loss: float
    running_loss: float
    lr: float
    units_per_s: float
    seconds: float


class Task(Protocol):
    """The experiment-specific part of a training run.

    Attributes:
        label: the progress bar's description.
        kind: the command whose task this is (``train``, ``synth``, ``lra``): every checkpoint
            records it as ``task``, and a run folder holding another task's run is refused.
        generators: names of the run's explicit ``torch.Generator``s, seeded ``seed + k`` in
            this order (``feature`` is the one feature redraws use).
        layout: where the run folder keeps its latest and best models.
        best_metric: the evaluation key whose highest value marks the best checkpoint, or None.

    A task that carries something of its own from one step to the next (the states of state
    passing) may also define ``state_dict() -> dict | None`` (data only: tensors, numbers,
    containers; None: nothing) and ``load_state_dict(saved, *, step)``: the engine saves each
    process's in ``train_state.pt`` and hands it back on resume (None where none was saved).
    """

    label: str
    kind: str
    generators: tuple[str, ...]
    layout: RunLayout
    best_metric: str | None

    def prepare(self, ctx: Distributed, *, resume: bool) -> None:
        """Loads data and checks the run folder (called once the process group exists)."""

    def build_model(self) -> nn.Module:
        """The model, built right after ``torch.manual_seed(seed)``."""

    def batch(self, gens: dict[str, torch.Generator], ctx: Distributed, device: torch.device) -> Any:
        """This process's share of the next global batch, drawn from ``gens``, on ``device``."""

    def loss(self, model: nn.Module, batch: Any, gens: dict[str, torch.Generator]) -> torch.Tensor:
        """The mean loss of ``batch`` (a scalar); ``model`` may be compiled or wrapped by DDP.

        Called under the run's autocast; the loss itself is computed in float32.
        """

    def evaluate(self, model: nn.Module, ctx: Distributed, device: torch.device) -> dict:
        """Evaluation metrics of the (unwrapped) model, reduced over processes."""

    def record(self, stats: StepStats, evaluation: dict | None) -> dict | None:
        """The metrics record of a step (``step`` included), or None to write none."""

    def metadata(self, step: int, evaluation: dict | None) -> dict:
        """The header metadata of the checkpoint of ``step``."""
