"""TensorBoard scalars of a training run, next to ``metrics.jsonl`` (the ``log`` extra).

Tags: ``train/loss`` (nats/token, mean over the global batch), ``train/lr``,
``train/tokens_per_s``, ``val/ce_within`` (validation cross-entropy on prefixes of the
training length L) and ``val/ce_beyond`` (on positions [L, 2L) of validation prefixes of
2L tokens, when some validation piece is that long); for ``spe lra``, ``train/loss_running``
(the running mean of the training loss) and ``val/accuracy``. Events go to ``OUT/tensorboard``;
view them with ``tensorboard --logdir OUT``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TAGS", "TENSORBOARD_SUFFIX", "ScalarLog", "require_tensorboard"]

# spe's event files end with this, so that --overwrite removes them and nobody else's.
TENSORBOARD_SUFFIX = ".spe"

# metrics.jsonl key -> TensorBoard tag
TAGS = {"loss": "train/loss", "lr": "train/lr", "tokens_per_s": "train/tokens_per_s",
        "val_loss": "val/ce_within", "val_loss_beyond": "val/ce_beyond",
        "train_loss": "train/loss_running", "val_accuracy": "val/accuracy"}


def require_tensorboard() -> None:
    """Raises ValueError with the install line if the ``tensorboard`` package is missing."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise ValueError("--tensorboard needs the tensorboard package: pip install 'spe[log]' "
                         "(or pip install tensorboard)") from None


class ScalarLog:
    """Writes the records of ``metrics.jsonl`` as TensorBoard scalars.

    Args:
        folder: event folder (created).
        purge_step: on resume, the checkpoint's step: events after it (from the interrupted
            attempt) are hidden, as ``metrics.jsonl`` is trimmed.
    """

    def __init__(self, folder: Path, *, purge_step: int | None = None) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder), purge_step=purge_step, filename_suffix=TENSORBOARD_SUFFIX)

    def write(self, record: dict) -> None:
        """Adds every known, non-None value of a metrics record at its ``step``."""
        for key, tag in TAGS.items():
            if record.get(key) is not None:
                self.writer.add_scalar(tag, record[key], record["step"])

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
