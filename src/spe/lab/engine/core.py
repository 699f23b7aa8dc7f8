"""The training engine: the one optimisation loop under ``spe train`` and ``spe lra``.

A :class:`~spe.lab.engine.task.Task` says what is trained (model, batches, loss, evaluation,
best metric); :func:`run` does the rest, the same way for every task:

* AdamW with the one parameter-group rule of :mod:`spe.lab.engine.optim`, warmup + cosine or
  rsqrt schedule, gradient-norm clipping;
* ``fp32``/``bf16``/``fp16`` autocast with a gradient scaler for fp16 (:mod:`spe.lab.engine.precision`);
* one process, or N under ``torchrun`` (:mod:`spe.lab.engine.distributed`): ``batch_size`` is the
  global batch, every process draws it from identically seeded generators and trains on
  its slice, DDP averages the gradients;
* ``torch.compile`` of the model on request (``compile``), with a warning and the
  uncompiled model where compilation is unavailable or fails;
* periodic evaluation, and a crash-safe checkpoint unit at every evaluation
  (:mod:`spe.lab.engine.state`: model + optimizer, scaler, step, every random state, the best
  record), the last K kept, the best model linked to ``best/`` when the task tracks one;
* resume from the newest complete unit (refused in one line when its model and state
  disagree, or when the number of processes changed);
* ``metrics.jsonl`` (:mod:`spe.lab.engine.metrics_log`), TensorBoard scalars, a tqdm bar;
* a stop with :class:`TrainingDiverged` when the loss is not finite, the last good
  checkpoint left as it was.

Sources: the loop follows nanoGPT's ``train.py`` (one loop, DDP, ``torch.compile``,
``GradScaler``) and torchtune's recipes (shared training utilities under thin recipes).
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from spe.checkpoint import MODEL_FILE, check_finite_weights, load_metadata
from spe.lab.engine import distributed as dist_
from spe.lab.engine.memory import check_model_memory
from spe.lab.engine.metrics_log import append_record, trim_records
from spe.lab.engine.optim import adamw, learning_rate_factor, scaled_lr
from spe.lab.engine.precision import autocast, grad_scaler
from spe.lab.engine.run_folder import METRICS_FILE, check_foreign_files, check_task, clear_run, mark_run, run_lock
from spe.lab.engine.state import (checkpoint_folder, global_rng_states, latest_unit, link, load_unit, repair_run_folder,
                             restore_global_rng, save_checkpoint)
from spe.lab.engine.task import EngineSettings, StepStats, Task
from spe.ops.sine.timed import compile_products

__all__ = ["METRICS_FILE", "Outcome", "TrainingDiverged", "apply_gradients", "compute_gradients", "run"]

log = logging.getLogger(__name__)

# Seeds of dropout on ranks > 0: their masks differ from rank 0's, as they would between slices of one batch.
_RANK_SEED_STRIDE = 1_000_003


class TrainingDiverged(ValueError):
    """The loss became NaN or infinite; the last good checkpoint is kept as it was."""


@dataclass
class Outcome:
    """What a finished :func:`run` leaves.

    Attributes:
        out: the run folder.
        step: the step reached (``settings.steps``).
        best: ``{"step", best_metric: value}`` of the best evaluation, or None.
        seconds: wall time of the run, summed over resumptions.
        model: the trained model (unwrapped, in train mode).
        is_main: this process is rank 0 (the one that writes files).
    """

    out: Path
    step: int
    best: dict | None
    seconds: float
    model: nn.Module
    is_main: bool = True


@dataclass
class _Training:
    """One training run's state (model, optimizer, generators, step, best record, timing) and the
    loop over it: built once by :func:`run`, restored from a checkpoint unit (:meth:`restore`), then
    :meth:`loop`; every step and checkpoint is a method, so the state is changed only here."""

    task: Task
    settings: EngineSettings
    ctx: dist_.Distributed
    model: nn.Module  # the model itself (saved, evaluated)
    step_model: nn.Module  # what a training step calls: the model, compiled and/or wrapped by DDP
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    gens: dict[str, torch.Generator]
    device: torch.device
    out: Path
    step: int = 0
    best: dict | None = None
    running_loss: float | None = None
    seconds_before: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    last_saved: int | None = None
    first_step: int = 0  # where this process's loop started (for the progress rate)
    compile_pending: bool = False  # compiled, and not yet seen to run
    tb: object | None = None

    def seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self.started

    def wrap(self) -> None:
        """``step_model``: the model, compiled on request, wrapped by DDP under torchrun."""
        compiled = self.model
        if self.settings.compile:
            try:
                compiled = torch.compile(self.model)
                compile_products(next(self.model.parameters()).device)
                self.compile_pending = True
            except Exception as err:  # noqa: BLE001 - any failure falls back to eager mode
                _compile_failed(err)
        self.step_model = self.ddp(compiled)

    def ddp(self, model: nn.Module) -> nn.Module:
        if not self.ctx.enabled:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def restore(self) -> None:
        """Loads weights, optimizer, scaler, random states and records of the newest complete checkpoint unit."""
        from safetensors.torch import load_file

        unit = latest_unit(self.out, self.task.layout.latest)
        _, ts = load_unit(unit, what=f"cannot resume {self.out}")
        world = ts["world_size"]
        if world != self.ctx.world_size:
            raise ValueError(f"--resume: {self.out} was trained by {world} process(es), now {self.ctx.world_size}: "
                             f"resume with the same number (torchrun --nproc-per-node {world}); batch slices and "
                             "random states are per process")
        weights = load_file(str(unit.model))
        check_finite_weights(unit.model, weights)  # a resumed NaN would only diverge again, later
        if getattr(self.model.config, "tie_embeddings", False):
            weights["head.weight"] = weights["embed.weight"]
        self.model.load_state_dict(weights)
        self.load_optimizer(ts, unit.state)
        if ts.get("scaler"):
            self.scaler.load_state_dict(ts["scaler"])
        restore_global_rng(ts["rng"][self.ctx.rank])
        for name, gen in self.gens.items():
            gen.set_state(ts[f"{name}_gen"])
        self.seconds_before = float(ts["seconds"])
        self.step, self.best, self.running_loss = ts["step"], ts["best"], ts.get("running_loss")
        if hasattr(self.task, "load_state_dict"):
            self.task.load_state_dict(ts["task"][self.ctx.rank] if "task" in ts else None, step=self.step)
        self.last_saved = self.step
        if self.ctx.is_main:
            self.repair_best()
        log.info("resuming %s at step %d", self.out, self.step)

    def load_optimizer(self, ts: dict, file: Path) -> None:
        saved = [len(g["params"]) for g in ts["optimizer"]["param_groups"]]
        current = [len(g["params"]) for g in self.optimizer.param_groups]
        if saved != current:
            raise ValueError(f"cannot resume {self.out}: {file} holds an optimizer over parameter groups of "
                             f"{saved} tensors, this model's are {current} (a state written by an older spe, "
                             "with another weight-decay rule): delete the run folder to train it again")
        self.optimizer.load_state_dict(ts["optimizer"])

    def repair_best(self) -> None:
        """Points ``best/`` at the checkpoint the state's best record names (a kill can leave it behind)."""
        best_dir = self.task.layout.best
        if best_dir is None or self.best is None:
            return
        target = self.out / best_dir / MODEL_FILE
        if target.is_file() and load_metadata(target).get("step") == self.best["step"]:
            return
        source = checkpoint_folder(self.out, self.best["step"]) / MODEL_FILE
        if not source.is_file():
            raise ValueError(f"cannot resume {self.out}: the best checkpoint (step {self.best['step']}) is neither in "
                             f"{target} nor in {source.parent}: delete the run folder to train it again")
        link(source, target)

    def check_generators(self) -> None:
        for name, gen in self.gens.items():
            dist_.check_same(gen.get_state(), f"the {name} generator", self.ctx, self.device)

    def start_files(self, overwrite: bool) -> None:
        """Rank 0: clears a run replaced by ``overwrite``, trims the metrics, opens TensorBoard."""
        self.out.mkdir(parents=True, exist_ok=True)
        if overwrite:
            clear_run(self.out, self.task.layout)
        mark_run(self.out, self.task.label)
        trim_records(self.out / METRICS_FILE, self.step)
        if self.settings.tensorboard:
            from spe.lab.engine.tensorboard import ScalarLog

            self.tb = ScalarLog(self.out / "tensorboard", purge_step=self.step + 1 if self.step else None)

    def train_step(self) -> float:
        """One optimizer step on this process's slice of the global batch; returns the global mean loss."""
        s = self.settings
        lr = s.lr * learning_rate_factor(self.step, steps=s.steps, warmup_steps=s.warmup_steps, schedule=s.schedule,
                                         min_lr_ratio=s.min_lr_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = scaled_lr(group, lr)
        if s.feature_redraw_every and self.step % s.feature_redraw_every == 0 and self.step and "feature" in self.gens:
            self.model.redraw_features(self.gens["feature"])
        batch = self.task.batch(self.gens, self.ctx, self.device)
        loss = self.forward_backward(batch)
        (total,) = dist_.all_sum([loss.item()], self.ctx, self.device)
        mean = total / self.ctx.world_size
        if not math.isfinite(mean):
            raise TrainingDiverged(self.diverged_message(self.step + 1, mean))
        apply_gradients(self.optimizer, self.model.parameters(), grad_clip=s.grad_clip, scaler=self.scaler)
        return mean

    def forward_backward(self, batch) -> torch.Tensor:
        """The loss of ``batch`` and its gradients; a compiled model that fails on its first step is dropped."""
        if not self.compile_pending:
            return self.loss_and_grads(batch)
        saved = {name: g.get_state() for name, g in self.gens.items()}, torch.get_rng_state()
        try:
            loss = self.loss_and_grads(batch)
        except Exception as err:  # noqa: BLE001 - inductor raises many types; any of them means eager mode
            _compile_failed(err)
            for name, state in saved[0].items():  # the eager step draws what the failed one drew
                self.gens[name].set_state(state)
            torch.set_rng_state(saved[1])
            self.step_model = self.ddp(self.model)
            loss = self.loss_and_grads(batch)
        self.compile_pending = False
        return loss

    def loss_and_grads(self, batch) -> torch.Tensor:
        with autocast(self.settings.precision, self.device.type):
            loss = self.task.loss(self.step_model, batch, self.gens)
        compute_gradients(loss, self.optimizer, self.scaler)
        return loss

    def diverged_message(self, step: int, loss: float) -> str:
        lr = self.optimizer.param_groups[0]["lr"]
        model = self.out / self.task.layout.latest / MODEL_FILE
        kept = (f"the last good checkpoint is {model} (step {self.last_saved}), left as it was; resume it after "
                "lowering the learning rate (--lr)" if self.last_saved else "no checkpoint had been written yet")
        return f"training stopped: the loss is {loss} at step {step} (lr {lr:.3g}); {kept}"

    @torch.no_grad()
    def evaluate(self) -> dict:
        self.model.eval()
        try:
            return self.task.evaluate(self.model, self.ctx, self.device)
        finally:
            self.model.train()

    def save(self, evaluation: dict, improved: bool) -> None:
        """Checkpoint unit of every process's state, written by rank 0; links ``best/`` first when improved."""
        mine = (global_rng_states(), self.task.state_dict() if hasattr(self.task, "state_dict") else None)
        every = [mine]
        if self.ctx.enabled:
            import torch.distributed as dist

            every = [None] * self.ctx.world_size
            dist.all_gather_object(every, mine)
        if self.ctx.is_main:
            rng, tasks = (list(column) for column in zip(*every))
            state = {"optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(),
                     "world_size": self.ctx.world_size, "rng": rng, "best": self.best,
                     "running_loss": self.running_loss, "seconds": self.seconds(), **{f"{name}_gen": g.get_state() for name, g in self.gens.items()},
                     **({"task": tasks} if any(t is not None for t in tasks) else {})}
            layout = self.task.layout
            best = (lambda folder: link(folder / MODEL_FILE, self.out / layout.best / MODEL_FILE)) \
                if improved and layout.best else None
            save_checkpoint(self.out, self.model, state, step=self.step,
                            metadata=self._metadata(evaluation),
                            keep=self.settings.keep_checkpoints, latest=layout.latest, before_links=best)
        self.last_saved = self.step
        dist_.barrier(self.ctx)

    def _metadata(self, evaluation: dict | None) -> dict:
        """The checkpoint's header metadata: the task's, and which task wrote it (``check_task`` reads it)."""
        kind = getattr(self.task, "kind", None)
        return {**({"task": kind} if kind else {}), **self.task.metadata(self.step, evaluation)}

    def after_step(self, loss: float, bar) -> None:
        """Records, evaluation, best tracking and the checkpoint of the step just done."""
        self.running_loss = loss if self.running_loss is None else 0.95 * self.running_loss + 0.05 * loss
        s = self.settings
        checkpoint = self.step % s.eval_every == 0 or self.step == s.steps
        evaluation = self.evaluate() if checkpoint else None
        metric = self.task.best_metric
        improved = bool(evaluation and metric and (self.best is None or evaluation[metric] > self.best[metric]))
        if improved:
            self.best = {"step": self.step, metric: evaluation[metric]}
        examples = (self.step - self.first_step) * s.batch_size
        stats = StepStats(self.step, loss, self.running_loss, self.optimizer.param_groups[0]["lr"],
                          examples * s.units_per_example / max(time.perf_counter() - self.started, 1e-9),
                          self.seconds())
        record = self.task.record(stats, evaluation)
        bar.set_postfix(loss=f"{self.running_loss:.3f}", refresh=False)
        bar.update(1)
        # the record goes first: a kill before the checkpoint leaves a record that resuming trims
        if self.ctx.is_main and record is not None:
            append_record(self.out / METRICS_FILE, record)
            if self.tb is not None:
                self.tb.write(record)
        if checkpoint:
            self.check_generators()
            self.save(evaluation, improved)
            if self.ctx.is_main:
                shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in evaluation.items())
                line = f"step {self.step}: loss {self.running_loss:.3f} (running mean), {shown}"
                bar.write(line) if not bar.disable else log.info("%s", line)

    def loop(self, progress: bool) -> None:
        """Optimizer steps from ``self.step`` to ``settings.steps``."""
        from tqdm.auto import tqdm

        self.first_step = self.step
        self.started = time.perf_counter()
        self.model.train()
        bar = tqdm(total=self.settings.steps, initial=self.step, desc=self.task.label, unit="step",
                   disable=not progress, dynamic_ncols=True)
        while self.step < self.settings.steps:
            loss = self.train_step()
            self.step += 1
            self.after_step(loss, bar)
        bar.close()


def run(task: Task, settings: EngineSettings, out: str | Path, *, resume: bool, overwrite: bool = False,
        progress: bool = True) -> Outcome:
    """Trains ``task`` into the run folder ``out``, from its newest checkpoint when ``resume``.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) every process calls this with the same arguments;
    only rank 0 writes files.

    Args:
        task: the experiment (see :class:`~spe.lab.engine.task.Task`).
        settings: optimisation and run options.
        out: the run folder.
        resume: continue from the newest complete checkpoint unit in ``out``, if there is one.
        overwrite: remove a previous run's files from ``out`` first (nothing else in it).
        progress: show a progress bar (rank 0).

    Returns:
        The :class:`Outcome`.

    Raises:
        ValueError: for an unusable configuration (no CUDA, a batch the processes cannot
            share, TensorBoard missing), a checkpoint unit that cannot be resumed, or a loss
            that became NaN or infinite (:class:`TrainingDiverged`).
    """
    device_type = "cuda" if str(settings.device).startswith("cuda") else "cpu"
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but PyTorch sees no CUDA device")
    if settings.tensorboard:
        from spe.lab.engine.tensorboard import require_tensorboard

        require_tensorboard()
    warn_long_warmup(settings.warmup_steps, settings.steps, settings.lr)
    with dist_.session(device_type) as ctx, run_lock(out, ctx):
        return _run(task, settings, Path(out), ctx, resume=resume, overwrite=overwrite,
                    progress=progress and ctx.is_main)


def warn_long_warmup(warmup_steps: int, steps: int, lr: float) -> None:
    """Warns (one line) when the linear warm-up lasts the whole run: the learning rate then
    never decays and reaches ``lr`` only at the last step, if at all."""
    if warmup_steps >= steps:
        warnings.warn(f"warmup_steps {warmup_steps} ≥ steps {steps}: the learning rate rises for the whole run "
                      f"and ends at {lr * min(1.0, steps / warmup_steps):g} (peak lr {lr:g}), with no decay; "
                      f"pass --warmup-steps below {steps}", stacklevel=2)


def _run(task: Task, settings: EngineSettings, out: Path, ctx: dist_.Distributed, *, resume: bool,
         overwrite: bool, progress: bool) -> Outcome:
    if settings.batch_size % ctx.world_size:
        raise ValueError(f"batch_size {settings.batch_size} (the global batch) is not divisible by the "
                         f"{ctx.world_size} processes")
    device = dist_.process_device(settings.device, ctx)
    if ctx.is_main:
        check_foreign_files(out, task.layout)
        if getattr(task, "kind", None):
            check_task(out, task.layout.latest, task.kind)
    if ctx.is_main and not overwrite:
        repair_run_folder(out, task.layout.latest)  # a crash between two renames leaves a mismatched pair
    dist_.barrier(ctx)
    task.prepare(ctx, resume=resume)
    # on the meta device, before any allocation; the training length where the task has one
    cfg = getattr(task, "cfg", None)
    check_model_memory(task.build_model, device,
                       positions=getattr(cfg, "seq_len", None) or getattr(cfg, "max_length", None) or 1)
    torch.manual_seed(settings.seed)
    model = task.build_model().to(device)
    if ctx.rank:
        torch.manual_seed(settings.seed + _RANK_SEED_STRIDE * ctx.rank)
    run = _Training(task, settings, ctx, model, model, adamw(model, lr=settings.lr, weight_decay=settings.weight_decay,
                                                          positional_lr_scale=settings.positional_lr_scale),
               grad_scaler(settings.precision, device.type),
               {name: torch.Generator().manual_seed(settings.seed + k) for k, name in enumerate(task.generators)},
               device, out)
    run.wrap()
    if resume and latest_unit(out, task.layout.latest) is not None:
        run.restore()
    run.check_generators()
    if ctx.is_main:
        run.start_files(overwrite)
    log.info("%s: %.2f M parameters; %d process(es), %s%s", task.label,
             sum(p.numel() for p in model.parameters()) / 1e6, ctx.world_size, settings.precision,
             ", compiled" if run.compile_pending else "")
    try:
        run.loop(progress)
    finally:
        if run.tb is not None:
            run.tb.close()
    return Outcome(out, run.step, run.best, run.seconds(), model, ctx.is_main)


def _compile_failed(err: BaseException) -> None:
    reason = " ".join(str(err).split())[:200] or type(err).__name__
    warnings.warn(f"--compile: torch.compile is unavailable or failed here ({type(err).__name__}: {reason}); "
                  "training continues uncompiled", RuntimeWarning, stacklevel=3)


def compute_gradients(loss: torch.Tensor, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None = None) -> None:
    """Replaces the gradients of ``optimizer``'s parameters by those of ``loss`` (scaled by ``scaler`` for fp16)."""
    optimizer.zero_grad(set_to_none=True)
    (scaler.scale(loss) if scaler is not None else loss).backward()


def apply_gradients(optimizer: torch.optim.Optimizer, parameters, *, grad_clip: float,
                    scaler: torch.amp.GradScaler | None = None) -> None:
    """One optimizer step: unscales (fp16), clips the global gradient norm at ``grad_clip`` (0: no clip), steps."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


