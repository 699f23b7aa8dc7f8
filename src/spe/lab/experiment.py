"""What every experiment of the lab trains with: :class:`ExperimentOptions`, one config for the
engine's options, and ``KEY=VALUE`` overrides of a model's options (:func:`parse_model_option`).

The music language model (``spe train``: :class:`~spe.lab.train.config.TrainConfig`) and the
Long Range Arena (``spe lra``: :class:`~spe.lab.lra.config.LRAConfig`) extend this one class
with their task's data and run options. Each task class is a named preset: where its
experiments were run with another default, it redeclares that field and says why in its
docstring; every other default is this class's, so the two cannot drift apart.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field

from spe.field_types import check_field_types
from spe.lab.options import check_options

__all__ = ["ExperimentOptions", "model_options", "parse_model_option"]


@dataclass(kw_only=True)
class ExperimentOptions:
    """The options of the one training engine (:class:`~spe.lab.train.task.EngineSettings`),
    named, typed and checked alike for every task; keyword-only.

    Attributes:
        data: the task's data (a folder, or a named corpus); None: the task's embedded default.
        steps: optimizer steps (per seed).
        batch_size: examples per optimizer step, over all processes (under ``torchrun`` with N
            processes each takes ``batch_size / N`` of the same examples, so the same config
            trains the same model on 1 or N processes).
        lr: peak learning rate (AdamW).
        warmup_steps: linear warmup length; then ``schedule``.
        schedule: ``cosine`` (decay to ``lr · min_lr_ratio`` at ``steps``) or ``rsqrt`` (LRA's
            lr·sqrt(warmup / step), no floor); :func:`spe.lab.train.optim.learning_rate_factor`.
        min_lr_ratio: final learning rate of the cosine as a fraction of ``lr``: 0.1, as
            nanoGPT's recipe (min_lr ≈ lr / 10).
        weight_decay: AdamW decay of weight matrices (not of norms, biases, embeddings and
            positional parameters).
        grad_clip: global gradient-norm clip (0: none).
        positional_lr_scale: learning-rate multiplier of the positional-encoding parameters
            (SPE frequencies, gains, filters and gates, learned embeddings;
            :func:`spe.lab.train.optim.param_groups`); 1.0: the model's learning rate.
        eval_every: steps between validations and (resumable) checkpoints.
        feature_redraw_every: steps between redraws of the FAVOR+ projections (0: never):
            1,000, performer-pytorch's ``feature_redraw_interval``.
        device: ``cpu`` or ``cuda`` (``cuda:N``; under ``torchrun`` each process takes the GPU
            of its local rank).
        precision: ``fp32``, ``bf16`` (autocast, CPU or CUDA) or ``fp16`` (autocast with a
            gradient scaler, CUDA only); weights and checkpoints stay float32.
        tensorboard: also write TensorBoard scalars to the run's ``tensorboard/`` (the ``log`` extra).
        keep_checkpoints: checkpoint folders ``checkpoints/step-SSSSSSS/`` kept (the newest).
        compile: ``torch.compile`` the model for the training steps (where compilation is
            unavailable or fails, a warning and the uncompiled model).
        allow_data_change: let a resume continue on data whose examples or split changed since
            the run started (with a warning naming the change); off: such a resume is refused.
        model: the task's model options (:class:`~spe.models.ModelConfig` for the language
            model, :class:`~spe.models.ClassifierConfig` for LRA), checked by the task's class.

    Raises:
        ValueError: from :meth:`check_experiment_options`, naming the option, the value and
            what is allowed, before any data is read.
    """

    data: str | None = None
    steps: int = 1000
    batch_size: int = 8
    lr: float = 1e-3
    warmup_steps: int = 100
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    positional_lr_scale: float = 1.0
    eval_every: int = 250
    feature_redraw_every: int = 1000
    device: str = "cpu"
    precision: str = "fp32"
    tensorboard: bool = False
    keep_checkpoints: int = 2
    compile: bool = False
    allow_data_change: bool = False
    model: dict = field(default_factory=dict)

    def check_experiment_options(self, what: str) -> None:
        """Checks every option's type (the resolved annotations) and rule
        (:data:`spe.lab.options.OPTION_RULES`), the device and the precision on it.

        Args:
            what: how messages name an option (``training option``, ``LRA option``).

        Raises:
            ValueError: naming the option and the value received (a wrong type too).
        """
        try:
            check_field_types(self.__dict__, type(self), what)
        except TypeError as err:
            raise ValueError(str(err)) from None
        check_options(self.__dict__)
        if self.device not in ("cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        from spe.lab.train.precision import check_precision  # torch: only once the options are read

        check_precision(self.precision, "cuda" if self.device.startswith("cuda") else "cpu")
        self.positional_lr_scale = float(self.positional_lr_scale)  # 10 and 10.0 are one setting


def parse_model_option(text: str) -> tuple[str, bool | int | float | str]:
    """``KEY=VALUE`` (``spe train`` and ``spe lra --model-option``) as ``(key, value)``: VALUE read
    as a TOML scalar (``true``, ``false``, ``64``, ``-2.5``, ``1e-3``, ``"text"``), else as the
    text itself (``spread``, ``orthogonal``).

    Only the syntax is checked here; the task's config checks the option (name, type, value).

    Raises:
        ValueError: naming ``text`` when it has no ``=``, no key, or a value that is not a scalar.
    """
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key:
        raise ValueError(f"--model-option takes KEY=VALUE (e.g. gated=false, num_realizations=64), got {text!r}")
    try:
        value = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw
    except RecursionError:  # thousands of nested arrays: no scalar either
        value = None
    if not isinstance(value, bool | int | float | str):
        raise ValueError(f"--model-option {key}: VALUE must be a number, true, false or a string, got {raw!r}")
    return key, value


def model_options(texts: list[str], *, flags: dict | None = None) -> dict:
    """Model options given on a command line as one dict: the model flags (``flags``: option name
    -> value, those given, ``decay`` included) and every ``--model-option KEY=VALUE``.

    Raises:
        ValueError: as :func:`parse_model_option`, or naming the two places that give one key
            two values (``--model-option decay='gated' contradicts --decay fixed``).
    """
    options = dict(flags or {})
    given = {key: f"--{key.replace('_', '-')} {value}" for key, value in options.items()}
    for text in texts:
        key, value = parse_model_option(text)
        if key in options and options[key] != value:
            raise ValueError(f"--model-option {key}={value!r} contradicts {given[key]}; give one value")
        options[key] = value
        given[key] = f"--model-option {key}={value!r}"
    return options
