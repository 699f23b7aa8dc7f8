"""What the training engine (:mod:`spe.lab.train.engine`) asks of an experiment: a small task interface.

A task says what the model is, how a training batch is drawn from the run's explicit
generators, what the loss of a batch is, how the model is evaluated and which evaluation
metric makes a checkpoint "best". Everything else (optimizer, schedule, precision,
processes, checkpoints, metrics log, TensorBoard, progress bar) is the engine's.

The two tasks are the music language model (:class:`spe.lab.train.tasks.lm.LMTask`, ``spe
train``) and the Long Range Arena classifier (:class:`spe.lab.lra.task.LRATask`, ``spe lra``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch
from torch import nn

from spe.lab.experiment import ExperimentOptions
from spe.lab.options import check_options
from spe.lab.train.distributed import Distributed

__all__ = ["EngineSettings", "RunLayout", "StepStats", "Task"]


_SHARED = {f.name: f.default for f in fields(ExperimentOptions)}


@dataclass(frozen=True)
class EngineSettings:
    """How the engine trains (the task-independent options of ``spe train`` and ``spe lra``).

    Attributes:
        steps: optimizer steps of the whole run.
        batch_size: examples (crops, sequences, pairs) per step over all processes; under
            ``torchrun`` with N processes each takes B / N of them (N must divide B).
        lr: peak learning rate of AdamW.
        warmup_steps: linear warmup steps.
        schedule: ``cosine`` (to ``lr · min_lr_ratio`` at ``steps``) or ``rsqrt``.
        min_lr_ratio: the cosine's final learning rate as a fraction of ``lr``.
        weight_decay: AdamW decay of the weight matrices :func:`spe.lab.train.optim.param_groups` names.
        grad_clip: global gradient-norm clip (0: none).
        eval_every: steps between evaluations and checkpoints (and at the last step).
        seed: seeds the initialisation (``torch.manual_seed``) and the task's generators
            (generator k gets ``seed + k``).
        device: ``cpu``, ``cuda`` or ``cuda:N`` (under ``torchrun``: the local rank's GPU).
        precision: ``fp32``, ``bf16`` or ``fp16`` (:mod:`spe.lab.train.precision`).
        tensorboard: also write the records' scalars to ``out/tensorboard``.
        keep_checkpoints: checkpoint folders kept (the newest).
        compile: ``torch.compile`` the model for the training steps (falls back to the
            uncompiled model with a warning where compilation is unavailable or fails).
        feature_redraw_every: steps between FAVOR+ feature redraws from the ``feature``
            generator (0: never).
        units_per_example: what one example counts for in the progress rate (tokens of a crop).
        positional_lr_scale: learning-rate multiplier of positional-encoding parameters
            (:func:`spe.lab.train.optim.param_groups`; 1.0: none).
    """

    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    eval_every: int
    seed: int
    # the experiments' shared defaults (ExperimentOptions), never a third set
    weight_decay: float = _SHARED["weight_decay"]
    grad_clip: float = _SHARED["grad_clip"]
    schedule: str = _SHARED["schedule"]
    min_lr_ratio: float = _SHARED["min_lr_ratio"]
    device: str = _SHARED["device"]
    precision: str = _SHARED["precision"]
    tensorboard: bool = _SHARED["tensorboard"]
    keep_checkpoints: int = _SHARED["keep_checkpoints"]
    compile: bool = _SHARED["compile"]
    feature_redraw_every: int = _SHARED["feature_redraw_every"]
    units_per_example: int = 1
    positional_lr_scale: float = _SHARED["positional_lr_scale"]

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
            options: a configuration (:class:`~spe.lab.train.config.TrainConfig`,
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
