"""The music language model as a task of the training engine (``spe train``).

Random crops of L + 1 tokens from the training pieces (optionally transposed), next-token
cross-entropy, and at every evaluation the validation cross-entropy within the training
length (prefixes of L + 1 tokens) and beyond it (positions [L, 2L) of prefixes of 2L + 1
tokens, where the model can take them). With ``state_passing`` each crop starts from the
detached final state of a crop of the previous step (:mod:`spe.lab.music.state_passing`).
Letters: B = batch, L = training length, V = vocabulary.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field, fields, replace

import torch

from spe.attention.kernels import kernel_spec
from spe.checkpoint import max_positions
from spe.encodings.onset import OnsetClock, onset_tokens, reads_onsets, tokens_per_beat
from spe.models.decoder_lm import DecoderLM
from spe.models.loss import cross_entropy
from spe.lab.labels import run_label
from spe.lab.engine import distributed as dist_
from spe.lab.music.config import TrainConfig
from spe.lab.music.state_passing import CarriedBatch, StatePassing, chain_steps
from spe.lab.engine.data_check import data_record
from spe.lab.music.status import check_resume, check_run
from spe.lab.engine.task import EngineSettings, RunLayout, StepStats
from spe.lab.music.validation import validation_sums

__all__ = ["LMTask", "build_model", "engine_settings"]

log = logging.getLogger(__name__)


def build_model(cfg: TrainConfig, vocab_size: int, **settings) -> DecoderLM:
    """The model ``cfg`` trains, initialised from ``cfg.seed`` (the same weights for the same
    config), with model ``settings`` the data gives (the onset clock's)."""
    torch.manual_seed(cfg.seed)
    return DecoderLM(replace(cfg.model_config(vocab_size), **settings))


def onset_settings(vocab: dict[str, int], train_pieces) -> dict:
    """The model settings of sineSPE on the onset clock (``spe_time="onset"``): the vocabulary's
    clock tokens and the scale s = the training pieces' mean tokens per beat
    (:func:`~spe.encodings.onset.tokens_per_beat`), so that τ = s · onset spans what the index does.
    Recorded in the model config, hence in checkpoints: evaluation and generation read the same clock.

    Raises:
        ValueError: for a vocabulary without onsets (:func:`~spe.encodings.onset.onset_tokens`).
    """
    tokens = onset_tokens(vocab)
    return {"onset_tokens": tokens,
            "onset_scale": tokens_per_beat(train_pieces, OnsetClock(tokens, max(vocab.values()) + 1))}


def engine_settings(cfg: TrainConfig) -> EngineSettings:
    """The engine options of a music training configuration: its options of the same names, and
    ``units_per_example = seq_len`` (the progress rate counts tokens)."""
    return EngineSettings.from_options(cfg, units_per_example=cfg.seq_len)


@dataclass
class LMTask:
    """Next-token prediction on REMI crops (see the module docstring).

    Args:
        cfg: the training configuration.
        overwrite: the run replaces a previous one (checked by :func:`~spe.lab.music.status.check_run`).
        progress: show the corpus conversion's progress.
    """

    cfg: TrainConfig
    overwrite: bool = False
    progress: bool = True
    label: str = "train"
    kind: str = "train"
    generators: tuple[str, ...] = ("data", "code", "feature")
    layout: RunLayout = field(default_factory=lambda: RunLayout(latest="", best=None, extra_files=("loss.png",)))
    best_metric: str | None = None
    meta: dict = field(default_factory=dict)
    model_settings: dict = field(default_factory=dict)
    passing: StatePassing | None = None
    stored_tokenizer: str | None = None  # a resumed run's (JSON text): it wins over the options

    def prepare(self, ctx: dist_.Distributed, *, resume: bool) -> None:
        """Checks the run folder, loads the split (rank 0 tokenises and caches it first)."""
        status = check_run(self.cfg, resume, self.overwrite)
        if resume:
            self._keep_recorded_tokenizer(status.metadata)
        if not ctx.is_main:
            dist_.barrier(ctx)
        self._load_data(self.progress and ctx.is_main)
        if ctx.is_main:
            dist_.barrier(ctx)
        data = data_record(train=self.split.train_pieces, validation=self.split.val_pieces)
        if resume:
            check_resume(status, self.split.tokenizer_json, data, allow_data_change=self.cfg.allow_data_change)
            if status.metadata.get("train", {}).get("state_passing") and not self.cfg.state_passing:
                warnings.warn(f"--resume: {status.out} was trained with state passing; it goes on without it, as "
                              "asked (pass --state-passing to keep it)", stacklevel=2)
        self.meta = {"tokenizer": self.split.tokenizer_json, "train": self.cfg.to_dict(), "data": data,
                     "num_train_pieces": len(self.split.train_pieces),
                     "num_val_pieces": len(self.split.val_pieces), "world_size": ctx.world_size}
        log.info("%d training / %d validation pieces%s", len(self.split.train_pieces), len(self.split.val_pieces),
                 f" ({len(self.split.test_pieces)} test pieces of ≥ {self.cfg.test_min_tokens} tokens held out)"
                 if self.split.test_pieces else "")

    def _keep_recorded_tokenizer(self, metadata: dict) -> None:
        """A resumed run keeps the tokenizer it stored; one from before the tokenizer options (it
        recorded none) records those its tokenizer has, whatever the defaults now are."""
        from spe.lab.music.corpus import TokenizerOptions, tokenizer_options

        self.stored_tokenizer = metadata.get("tokenizer")
        names = [f.name for f in fields(TokenizerOptions)]
        if self.stored_tokenizer is not None and not any(name in metadata.get("train", {}) for name in names):
            kept = tokenizer_options(self.stored_tokenizer)
            self.cfg = replace(self.cfg, **{name: getattr(kept, name) for name in names})

    def _load_data(self, progress: bool) -> None:
        """The split, the crop sampler, and validation prefixes of L + 1 and 2L + 1 tokens."""
        from spe.lab.music.dataset import CropSampler, PitchShifter, prefix_batch
        from spe.lab.music.corpus import TokenizerOptions, tokenizer_from_json, tokenizer_summary
        from spe.lab.music.split import load_split

        cfg = self.cfg
        source = self.stored_tokenizer or TokenizerOptions(**{f.name: getattr(cfg, f.name)
                                                              for f in fields(TokenizerOptions)})
        self.split = load_split(cfg.data, cache_dir=cfg.cache_dir, val_fraction=cfg.val_fraction,
                                split_seed=cfg.split_seed, progress=progress, max_piece_tokens=cfg.max_piece_tokens,
                                test_min_tokens=cfg.test_min_tokens, num_test_pieces=cfg.num_test_pieces,
                                tokenizer=source)
        tokenizer = tokenizer_from_json(self.split.tokenizer_json)
        log.info("%s", tokenizer_summary(tokenizer))
        self.vocab_size = len(tokenizer)
        config = cfg.model_config(self.vocab_size)
        self.model_settings = {}  # what the data sets in the model (once: build_model may run on a meta device)
        if reads_onsets(config):
            self.model_settings = onset_settings(dict(tokenizer.vocab), self.split.train_pieces)
            measured, given = self.model_settings["onset_scale"], cfg.model.get("onset_scale")
            if given:  # the user's scale wins over the corpus's, and says so
                self.model_settings["onset_scale"] = given
                warnings.warn(f"onset clock: onset_scale {given:g} tokens per beat as given (the training pieces' "
                              f"mean is {measured:.4g}; leave onset_scale out to take it)", stacklevel=4)
            else:
                log.info("onset clock: %.4g tokens per beat (the training pieces' mean)", measured)
        shifter = PitchShifter(tokenizer.vocab, cfg.max_transpose) if cfg.max_transpose > 0 else None
        self.sampler = CropSampler(self.split.train_pieces, cfg.seq_len, shifter)
        self.val_batch = prefix_batch(self.split.val_pieces, cfg.seq_len + 1)  # (N, L + 1)
        if len(self.val_batch) == 0:
            warnings.warn(f"no validation piece has {cfg.seq_len + 1} tokens: training runs without validation "
                          f"(lower --seq-len or raise val_fraction)", stacklevel=4)
        self.val_long = prefix_batch(self.split.val_pieces, 2 * cfg.seq_len + 1)  # (N', 2L + 1)

    def build_model(self) -> DecoderLM:
        model = build_model(self.cfg, self.vocab_size, **self.model_settings)
        self.label = f"train {run_label(model.config)}"
        if self.cfg.state_passing:  # feature redraws restart chains where there are random features
            redraws = self.cfg.feature_redraw_every if kernel_spec(model.config.attention).random_features else 0
            self.passing = StatePassing(chain_steps(model.config, self.cfg.seq_len), redraws)
        limit = max_positions(model.config)
        if limit is not None and 2 * self.cfg.seq_len > limit:  # no room for the beyond-range validation
            self.val_long = self.val_long[:0]
        return model

    def batch(self, gens: dict[str, torch.Generator], ctx: dist_.Distributed,
              device: torch.device) -> torch.Tensor | CarriedBatch:
        """This process's (B / N, L + 1) slice of B crops (with state passing: and their states)."""
        crops = dist_.shard(self.sampler.sample(self.cfg.batch_size, gens["data"]), ctx).to(device)
        return crops if self.passing is None else self.passing.batch(crops, gens["code"])

    def loss(self, model, batch: torch.Tensor | CarriedBatch, gens: dict[str, torch.Generator]) -> torch.Tensor:
        if isinstance(batch, CarriedBatch):  # through model(...): DDP and compiled wrappers see the call
            logits, final = model(batch.tokens[:, :-1], generator=batch.code_generator(), state=batch.state,
                                  return_state=True)
            self.passing.carry(final)
            return cross_entropy(logits, batch.tokens[:, 1:])
        logits = model(batch[:, :-1], generator=gens["code"])  # (B, L, V)
        return cross_entropy(logits, batch[:, 1:])

    def state_dict(self) -> dict | None:
        """This process's carried states (state passing), for the training state; None without."""
        return None if self.passing is None else self.passing.state_dict()

    def load_state_dict(self, saved: dict | None, *, step: int) -> None:
        """Goes on from :meth:`state_dict`'s output saved at ``step`` (None: nothing saved)."""
        if self.passing is not None:
            self.passing.load_state_dict(saved, step=step)

    def evaluate(self, model: DecoderLM, ctx: dist_.Distributed, device: torch.device) -> dict:
        """``val_loss`` (within L) and ``val_loss_beyond`` ([L, 2L)) in nats/token, None without data."""
        results = []
        for batch, start in ((self.val_batch, 0), (self.val_long, self.cfg.seq_len)):
            mine = batch[ctx.rank::ctx.world_size]
            total, count = validation_sums(model, mine, batch_size=self.cfg.batch_size, device=device,
                                            precision=self.cfg.precision, start=start) if len(mine) else (0.0, 0)
            total, count = dist_.all_sum([total, float(count)], ctx, device)
            results.append(total / count if count else None)
        return {"val_loss": results[0], "val_loss_beyond": results[1]}

    def record(self, stats: StepStats, evaluation: dict | None) -> dict:
        """Every step: loss (nats/token), lr, tokens/s; validation at evaluations."""
        record = {"step": stats.step, "loss": stats.loss, "lr": stats.lr, "tokens_per_s": stats.units_per_s}
        return {**record, **evaluation} if evaluation is not None else record

    def metadata(self, step: int, evaluation: dict | None) -> dict:
        return {**self.meta, "step": step, "val_loss": (evaluation or {}).get("val_loss")}
