"""The training loop: AdamW, warmup + cosine, periodic validation, crash-safe resumable checkpoints.

One process, or N processes under ``torchrun`` (:mod:`spe.train.distributed`: ``batch_size``
is the global batch, each process trains on its slice); ``fp32``/``bf16``/``fp16``
(:mod:`spe.train.precision`); checkpoints as :mod:`spe.train.state` describes; TensorBoard
scalars on request (:mod:`spe.train.tensorboard`).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from spe import strict_json
from spe.checkpoint import MODEL_FILE, TRAIN_STATE_FILE, atomic_write, load_metadata, max_positions
from spe.models.decoder_lm import DecoderLM
from spe.models.loss import cross_entropy
from spe.train import distributed as dist_
from spe.train.config import TrainConfig
from spe.train.precision import autocast, grad_scaler
from spe.train.state import (CHECKPOINTS_DIR, global_rng_states, latest_checkpoint, load_train_state,
                             repair_run_folder, restore_global_rng, save_checkpoint)
from spe.train.status import check_resume, check_run
from spe.train.validation import plot_losses, validation_loss, validation_sums

__all__ = ["TRAIN_STATE_FILE", "TrainingDiverged", "build_model", "train", "validation_loss"]

log = logging.getLogger(__name__)
# Files of a run that --overwrite removes (and nothing else in the folder).
_RUN_FILES = (MODEL_FILE, TRAIN_STATE_FILE, "metrics.jsonl", "loss.png")
_RUN_DIRS = (CHECKPOINTS_DIR, "tensorboard")


class TrainingDiverged(ValueError):
    """The loss became NaN or infinite; the last good checkpoint is kept as it was."""


def _param_groups(model: DecoderLM, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        # Only weight matrices of linear layers decay; embeddings, norms, biases and positional
        # parameters (frequencies, phases, gains, filters, gates) do not.
        is_matrix = p.dim() == 2 and ("qkv" in name or "out" in name or "ffn" in name)
        (decay if is_matrix else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _lr_factor(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))



@dataclass
class _Generators:
    """The run's explicit random streams: crops, SPE codes, FAVOR+ feature redraws.

    Every process of a distributed run holds the same three (same seeds, same states).
    """

    data: torch.Generator
    code: torch.Generator
    feature: torch.Generator

    @classmethod
    def seeded(cls, seed: int) -> _Generators:
        return cls(*(torch.Generator().manual_seed(seed + k) for k in range(3)))

    def states(self) -> dict:
        return {"data_gen": self.data.get_state(), "code_gen": self.code.get_state(),
                "feature_gen": self.feature.get_state()}

    def restore(self, states: dict) -> None:
        self.data.set_state(states["data_gen"])
        self.code.set_state(states["code_gen"])
        self.feature.set_state(states["feature_gen"])


@dataclass
class _Run:
    """Everything the loop touches, built once by :func:`train`."""

    cfg: TrainConfig
    ctx: dist_.Distributed
    model: DecoderLM  # the model itself (saved, validated)
    step_model: torch.nn.Module  # what the training step calls: the model, or its DDP wrapper
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    gens: _Generators
    sampler: object
    val_batch: torch.Tensor  # (N, L + 1) validation prefixes
    val_long: torch.Tensor  # (N', 2L + 1) validation prefixes for the beyond-range cross-entropy
    meta: dict
    device: torch.device
    out: Path
    tb: object | None = None
    last_saved: int | None = field(default=None)

    def check_generators(self) -> None:
        for name, gen in (("the crop generator", self.gens.data), ("the SPE code generator", self.gens.code),
                          ("the feature generator", self.gens.feature)):
            dist_.check_same(gen.get_state(), name, self.ctx, self.device)


def _restore(run: _Run) -> int:
    """Loads weights, optimizer, scaler and random states of the newest complete checkpoint; its step."""
    from safetensors.torch import load_file

    source = latest_checkpoint(run.out)
    saved_step = load_metadata(source).get("step")
    state = load_file(str(source / MODEL_FILE))
    if run.model.config.tie_embeddings:
        state["head.weight"] = state["embed.weight"]
    run.model.load_state_dict(state)
    ts = load_train_state(source)
    if ts["step"] != saved_step:
        raise ValueError(f"--resume: {source / TRAIN_STATE_FILE} is at step {ts['step']} but the checkpoint "
                         f"at step {saved_step}; the run was interrupted while saving")
    world = ts.get("world_size", 1)
    if world != run.ctx.world_size:
        raise ValueError(f"--resume: {run.out} was trained by {world} process(es), now {run.ctx.world_size}: "
                         f"resume with the same number (torchrun --nproc-per-node {world}); crop slices and "
                         "random states are per process")
    run.optimizer.load_state_dict(ts["optimizer"])
    if ts.get("scaler"):
        run.scaler.load_state_dict(ts["scaler"])
    restore_global_rng(ts["rng"][run.ctx.rank] if "rng" in ts else {"torch": ts["torch_rng"]})
    run.gens.restore(ts)
    log.info("resuming %s at step %d", run.out, ts["step"])
    return ts["step"]


def _save(run: _Run, step: int) -> None:
    """Checkpoint of every process's state, written by rank 0 (crash-safe, see spe.train.state)."""
    rng = [global_rng_states()]
    if run.ctx.enabled:
        import torch.distributed as dist

        rng = [None] * run.ctx.world_size
        dist.all_gather_object(rng, global_rng_states())
    if run.ctx.is_main:
        state = {"optimizer": run.optimizer.state_dict(), "scaler": run.scaler.state_dict(),
                 "world_size": run.ctx.world_size, "rng": rng, **run.gens.states()}
        save_checkpoint(run.out, run.model, state, step=step, metadata=run.meta,
                        keep=run.cfg.keep_checkpoints)
    run.last_saved = step
    _barrier(run.ctx)


def _barrier(ctx: dist_.Distributed) -> None:
    if ctx.enabled:
        import torch.distributed as dist

        dist.barrier()


def _trim_metrics(metrics_path: Path, step: int) -> None:
    """Keeps only the records the checkpoint we start from has seen."""
    if metrics_path.exists():
        kept = [line for line in metrics_path.read_text().splitlines() if _record_step(line) <= step]
        atomic_write(metrics_path, lambda tmp: Path(tmp).write_text("".join(line + "\n" for line in kept)))


def _record_step(line: str) -> float:
    """The step of a metrics line; infinite for a blank or half-written one (a kill while appending)."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


def _data(cfg: TrainConfig, progress: bool):
    """The split, the crop sampler, and validation prefixes of L + 1 and 2L + 1 tokens."""
    from spe.data.dataset import CropSampler, PitchShifter, prefix_batch
    from spe.data.music import make_tokenizer
    from spe.data.split import load_split

    split = load_split(cfg.data, cache_dir=cfg.cache_dir, val_fraction=cfg.val_fraction,
                       split_seed=cfg.split_seed, progress=progress, max_piece_tokens=cfg.max_piece_tokens)
    tokenizer = make_tokenizer()
    shifter = PitchShifter(tokenizer.vocab, cfg.max_transpose) if cfg.max_transpose > 0 else None
    sampler = CropSampler(split.train_pieces, cfg.seq_len, shifter)
    val_batch = prefix_batch(split.val_pieces, cfg.seq_len + 1)
    if len(val_batch) == 0:
        warnings.warn(f"no validation piece has {cfg.seq_len + 1} tokens: training runs without validation "
                      f"(lower --seq-len or raise val_fraction)", stacklevel=3)
    return split, len(tokenizer), sampler, val_batch, prefix_batch(split.val_pieces, 2 * cfg.seq_len + 1)


def build_model(cfg: TrainConfig, vocab_size: int) -> DecoderLM:
    """The model ``cfg`` trains, initialised from ``cfg.seed`` (the same weights for the same config)."""
    torch.manual_seed(cfg.seed)
    return DecoderLM(cfg.model_config(vocab_size))


def _clear_run(out: Path) -> None:
    """Removes the files of a previous run (--overwrite), nothing else."""
    for name in _RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in _RUN_DIRS:
        shutil.rmtree(out / name, ignore_errors=True)
    log.info("--overwrite: removed the previous run in %s", out)


def train(cfg: TrainConfig, *, resume: bool = False, progress: bool = True, overwrite: bool = False) -> Path:
    """Trains a decoder LM on REMI tokens and writes ``cfg.out/model.safetensors``.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) each process calls this with the same ``cfg``:
    ``cfg.batch_size`` is the global batch (divisible by the number of processes) and only
    rank 0 writes files.

    Args:
        cfg: the training configuration.
        resume: continue from ``cfg.out`` (model, optimizer, step, random states).
        progress: show a progress bar (rank 0).
        overwrite: replace a previous run in ``cfg.out`` (its checkpoints, metrics, plots).

    Returns:
        The run folder.

    Raises:
        ValueError: on unusable data, a bad configuration, a run folder that holds another
            run, a resume that does not match, or a loss that became NaN
            (:class:`TrainingDiverged`; the last good checkpoint is kept).
    """
    device_type = "cuda" if str(cfg.device).startswith("cuda") else "cpu"
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but PyTorch sees no CUDA device")
    if cfg.tensorboard:
        from spe.train.tensorboard import require_tensorboard

        require_tensorboard()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    ctx = dist_.setup(device_type)
    try:
        return _train(cfg, ctx, resume=resume, progress=progress and ctx.is_main, overwrite=overwrite)
    finally:
        dist_.teardown(ctx)


def _train(cfg: TrainConfig, ctx: dist_.Distributed, *, resume: bool, progress: bool,
           overwrite: bool) -> Path:
    if cfg.batch_size % ctx.world_size:
        raise ValueError(f"batch_size {cfg.batch_size} (the global batch) is not divisible by the "
                         f"{ctx.world_size} processes")
    # under torchrun each process takes the GPU of its local rank, whatever index --device names
    device = torch.device(f"cuda:{ctx.local_rank}" if ctx.enabled and str(cfg.device).startswith("cuda")
                          else cfg.device)
    if ctx.is_main and Path(cfg.out).is_dir():
        repair_run_folder(cfg.out)  # a crash between two renames leaves a mismatched pair
    _barrier(ctx)
    status = check_run(cfg, resume, overwrite)
    if not ctx.is_main:
        _barrier(ctx)  # rank 0 tokenises and caches the corpus first
    split, vocab_size, sampler, val_batch, val_long = _data(cfg, progress)
    if ctx.is_main:
        _barrier(ctx)
    model = build_model(cfg, vocab_size).to(device)
    limit = max_positions(model.config)
    if limit is not None and 2 * cfg.seq_len > limit:  # no room for the beyond-range validation
        val_long = val_long[:0]
    if ctx.rank:  # dropout masks differ between processes, as they would between slices of one batch
        torch.manual_seed(cfg.seed + 1_000_003 * ctx.rank)
    step_model = model
    if ctx.enabled:
        from torch.nn.parallel import DistributedDataParallel

        step_model = DistributedDataParallel(model,
                                             device_ids=[device.index] if device.type == "cuda" else None)
    meta = {"tokenizer": split.tokenizer_json, "train": cfg.to_dict(),
            "num_train_pieces": len(split.train_pieces), "num_val_pieces": len(split.val_pieces),
            "world_size": ctx.world_size}
    run = _Run(cfg, ctx, model, step_model,
               torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.98)),
               grad_scaler(cfg.precision, device.type), _Generators.seeded(cfg.seed), sampler, val_batch,
               val_long, meta, device, Path(cfg.out))
    step = 0
    if resume:
        check_resume(status, split.tokenizer_json)
        step = _restore(run)
        run.last_saved = step
    run.check_generators()
    if ctx.is_main:
        _start_files(run, step, overwrite)
    log.info("model: %s, %.2f M parameters; %d training / %d validation pieces; %d process(es), %s",
             model.config.positional + "/" + model.config.attention, model.num_parameters() / 1e6,
             len(split.train_pieces), len(split.val_pieces), ctx.world_size, cfg.precision)
    try:
        _loop(run, step, progress)
    finally:
        if run.tb is not None:
            run.tb.close()
    if ctx.is_main:
        plot_losses(run.out / "metrics.jsonl", run.out / "loss.png")
    return run.out


def _start_files(run: _Run, step: int, overwrite: bool) -> None:
    """Rank 0: clears a run replaced by --overwrite, trims the metrics, opens TensorBoard."""
    run.out.mkdir(parents=True, exist_ok=True)
    if overwrite:
        _clear_run(run.out)
    _trim_metrics(run.out / "metrics.jsonl", step)
    if run.cfg.tensorboard:
        from spe.train.tensorboard import ScalarLog

        run.tb = ScalarLog(run.out / "tensorboard", purge_step=step + 1 if step else None)


def _train_step(run: _Run, step: int) -> float:
    """One optimizer step on this process's slice of the global batch; returns the global mean loss."""
    cfg, model = run.cfg, run.model
    for group in run.optimizer.param_groups:
        group["lr"] = cfg.lr * _lr_factor(step, cfg)
    if cfg.feature_redraw_every and step % cfg.feature_redraw_every == 0 and step:
        model.redraw_features(run.gens.feature)
    batch = dist_.shard(run.sampler.sample(cfg.batch_size, run.gens.data), run.ctx).to(run.device)
    with autocast(cfg.precision, run.device.type):
        logits = run.step_model(batch[:, :-1], generator=run.gens.code)
    loss = cross_entropy(logits, batch[:, 1:])
    run.optimizer.zero_grad(set_to_none=True)
    run.scaler.scale(loss).backward()
    (total,) = dist_.all_sum([loss.item()], run.ctx, run.device)
    mean = total / run.ctx.world_size
    if not math.isfinite(mean):
        raise TrainingDiverged(_diverged_message(run, step + 1, mean))
    run.scaler.unscale_(run.optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    return mean


def _diverged_message(run: _Run, step: int, loss: float) -> str:
    lr = run.optimizer.param_groups[0]["lr"]
    kept = (f"the last good checkpoint is {run.out / MODEL_FILE} (step {run.last_saved}), left as it was; "
            "resume it with --resume after lowering --lr" if run.last_saved else
            "no checkpoint had been written yet")
    return f"training stopped: the loss is {loss} at step {step} (lr {lr:.3g}); {kept}"


@torch.no_grad()
def _validate(run: _Run) -> tuple[float | None, float | None]:
    """Validation cross-entropy within the training length and on [L, 2L), reduced over processes."""
    was_training = run.model.training
    run.model.eval()
    results = []
    for batch, start in ((run.val_batch, 0), (run.val_long, run.cfg.seq_len)):
        mine = batch[run.ctx.rank::run.ctx.world_size]
        total, count = validation_sums(run.model, mine, batch_size=run.cfg.batch_size, device=run.device,
                                        precision=run.cfg.precision, start=start) if len(mine) else (0.0, 0)
        total, count = dist_.all_sum([total, float(count)], run.ctx, run.device)
        results.append(total / count if count else None)
    run.model.train(was_training)
    return results[0], results[1]


def _loop(run: _Run, step: int, progress: bool) -> None:
    """Optimizer steps from ``step`` to ``cfg.steps``; validates and checkpoints every ``eval_every``."""
    from tqdm import tqdm

    cfg = run.cfg
    run.model.train()
    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {run.model.config.positional}", unit="step",
               disable=not progress, dynamic_ncols=True)
    tokens_seen, t0 = 0, time.perf_counter()
    while step < cfg.steps:
        loss = _train_step(run, step)
        step += 1
        tokens_seen += cfg.batch_size * cfg.seq_len
        rate = tokens_seen / (time.perf_counter() - t0)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
        bar.update(1)
        record = {"step": step, "loss": loss, "lr": run.optimizer.param_groups[0]["lr"], "tokens_per_s": rate}
        checkpoint = step % cfg.eval_every == 0 or step == cfg.steps
        if checkpoint:
            val, beyond = _validate(run)
            record.update(val_loss=val, val_loss_beyond=beyond)
            run.meta.update(step=step, val_loss=val)
            if run.ctx.is_main:
                bar.write(f"step {step}: train {loss:.3f}, validation "
                          f"{val if val is None else round(val, 3)} nats/token")
        # the record goes first: a kill before the checkpoint leaves a record that resuming trims
        if run.ctx.is_main:
            with open(run.out / "metrics.jsonl", "a") as fh:
                fh.write(strict_json.dumps(record) + "\n")
            if run.tb is not None:
                run.tb.write(record)
        if checkpoint:
            run.check_generators()
            _save(run, step)
    bar.close()
