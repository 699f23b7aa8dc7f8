"""Whether a run folder is new, resumable or finished, and what differs from the configuration asked for.

One answer for ``spe train --resume``, ``spe demo`` and ``spe sweep``: configurations are
compared with their defaults filled in (a checkpoint written before a model option existed
has that option's default), and the keys that differ are named.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path


from spe.checkpoint import MODEL_FILE, TRAIN_STATE_FILE, load_metadata
from spe.models.config import ModelConfig
from spe.lab.engine.data_check import check_data
from spe.lab.music.config import TrainConfig

__all__ = ["RESUME_KEYS", "RunStatus", "check_resume", "check_run", "run_status"]

log = logging.getLogger(__name__)

# Training options a run cannot change midway: they decide what the model sees and is validated on
# (the test split's are taken out of the corpus before the training / validation split).
RESUME_KEYS = ("data", "seq_len", "val_fraction", "split_seed", "max_transpose", "max_piece_tokens",
               "test_min_tokens", "num_test_pieces", "tempos", "time_signatures",
               "merge_tracks", "legacy_tokenizer")


@dataclass
class RunStatus:
    """What a run folder holds, relative to a training configuration.

    Attributes:
        state: ``"new"`` (no checkpoint), ``"finished"`` (a checkpoint at the configured
            number of steps) or ``"resume"`` (a checkpoint at another step).
        out: the run folder.
        step: the checkpoint's step (None when new).
        model_differences: model option -> (stored, asked), defaults filled in on both sides.
        train_differences: option of ``RESUME_KEYS`` -> (stored, asked).
        has_train_state: the folder holds the optimizer and random states needed to resume.
        metadata: the checkpoint's metadata (empty when new).
    """

    state: str
    out: Path
    step: int | None = None
    model_differences: dict = field(default_factory=dict)
    train_differences: dict = field(default_factory=dict)
    has_train_state: bool = False
    metadata: dict = field(default_factory=dict)

    @property
    def differences(self) -> dict:
        """Every differing option (model and training), option -> (stored, asked)."""
        return {**self.model_differences, **self.train_differences}

    def describe(self) -> str:
        """``key stored -> asked, ...`` for every differing option."""
        return ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in self.differences.items())


# Model settings the training data gives, not the options (the onset clock's, from the corpus the
# data record checks): a run resumes with what it stored.
_FROM_DATA = ("onset_scale", "onset_tokens")


def _model_differences(stored_config: dict, cfg: TrainConfig, vocab_size: int | None) -> dict:
    stored = ModelConfig.from_dict(stored_config).to_dict()
    asked = ModelConfig(vocab_size=vocab_size or stored["vocab_size"], **cfg.model).to_dict()
    return {k: (stored.get(k), v) for k, v in asked.items() if stored.get(k) != v and k not in _FROM_DATA}


def run_status(cfg: TrainConfig, *, vocab_size: int | None = None) -> RunStatus:
    """The status of the run folder ``cfg.out`` for training with ``cfg``.

    Args:
        cfg: the training configuration asked for (its model options already resolved).
        vocab_size: the tokenizer's vocabulary size, compared too when given (else the
            stored one is assumed: the tokenizer is compared separately).

    Raises:
        ValueError: if the folder holds a file that is not an spe checkpoint.
    """
    out = Path(cfg.out)
    has_state = (out / TRAIN_STATE_FILE).exists()
    if not (out / MODEL_FILE).exists():
        return RunStatus("new", out, has_train_state=has_state)
    saved = load_metadata(out)
    before = saved.get("train", {})
    train_diff = {k: (before[k], getattr(cfg, k)) for k in RESUME_KEYS if k in before and before[k] != getattr(cfg, k)}
    step = saved.get("step")
    return RunStatus("finished" if step == cfg.steps else "resume", out, step,
                     _model_differences(saved["config"], cfg, vocab_size), train_diff, has_state, saved)


def check_run(cfg: TrainConfig, resume: bool, overwrite: bool) -> RunStatus:
    """The run folder's status; refuses to overwrite a run or to resume nothing."""
    if resume and overwrite:
        raise ValueError("--resume continues the run in --out and --overwrite replaces it: pass one of them")
    status = run_status(cfg)
    out = status.out
    if resume and not status.has_train_state:
        raise ValueError(f"--resume: no training state in {out} (expected {out / TRAIN_STATE_FILE})")
    if resume and status.state == "new":
        raise ValueError(f"--resume: no checkpoint in {out} (expected {out / MODEL_FILE})")
    if not resume and not overwrite and status.state != "new":
        if status.differences:
            raise ValueError(f"{out} holds a run of another configuration ({status.describe()}): choose "
                             "another --out, or pass --overwrite to replace it")
        raise ValueError(f"{out} already holds a checkpoint: pass --resume to continue it, --overwrite to "
                         "start again, or choose another --out")
    return status


def check_resume(status: RunStatus, tokenizer_json: str, data: dict | None = None, *,
                 allow_data_change: bool = False) -> None:
    """Refuses to resume a run whose model, data or tokenizer differ from the configuration's.

    Args:
        status: the run folder's status (:func:`check_run`).
        tokenizer_json: the tokenizer of the data loaded now.
        data: the :func:`~spe.lab.engine.data_check.data_record` (``train``, ``validation``) of the split loaded now (None:
            not compared).
        allow_data_change: continue on changed data with a warning instead of refusing.

    Raises:
        ValueError: in one line naming what differs.
    """
    from spe.lab.music.corpus import same_tokenizer

    out, changed = status.out, status.model_differences
    if changed:
        detail = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())
        hint = " (pass --attention-window 0 to keep attending to the whole past)" \
            if list(changed) == ["attention_window"] and changed["attention_window"][0] is None else ""
        raise ValueError(f"--resume: the model configuration differs from the one in {out}: {detail}{hint}")
    if status.train_differences:
        key, (before, now) = next(iter(status.train_differences.items()))
        raise ValueError(f"--resume: {key} was {before!r} in {out}, now {now!r}")
    stored = status.metadata.get("tokenizer")
    if stored is not None and not same_tokenizer(stored, tokenizer_json):
        raise ValueError(f"--resume: the tokenizer differs from the one in {out}")
    if data is not None:
        meta = status.metadata
        before = meta.get("data")
        if before is None and "num_train_pieces" in meta:  # an older spe recorded the counts only
            before = {name: {"count": meta[key]} for name, key in
                      (("train", "num_train_pieces"), ("validation", "num_val_pieces")) if key in meta}
        source = meta.get("train", {}).get("data") or "the Bach chorales"
        check_data(before, data, where=f"the data in {source}", unit="pieces", allow_change=allow_data_change,
                   hint=f"restore it, train into another --out, or pass --allow-data-change to continue {out} "
                   "on the new split")
