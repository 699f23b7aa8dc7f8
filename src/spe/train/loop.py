"""The training loop: AdamW, warmup + cosine, periodic validation, atomic resumable checkpoints."""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from spe.checkpoint import MODEL_FILE, TRAIN_STATE_FILE, atomic_write, save
from spe.models.decoder_lm import DecoderLM
from spe.train.config import TrainConfig
from spe.train.status import RunStatus, run_status

__all__ = ["TRAIN_STATE_FILE", "build_model", "train", "validation_loss"]

log = logging.getLogger(__name__)


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


@torch.no_grad()
def validation_loss(model: DecoderLM, batch: torch.Tensor, *, batch_size: int, device) -> float:
    """Mean next-token cross-entropy (nats) over (N, L + 1) sequences, in eval mode."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(batch), batch_size):
        x = batch[i:i + batch_size].to(device)
        logits = model(x[:, :-1])
        total += float(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"))
        count += x[:, 1:].numel()
    model.train(was_training)
    return total / max(count, 1)


@dataclass
class _Generators:
    """The run's explicit random streams: crops, SPE codes, FAVOR+ feature redraws."""

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


def _check_run(cfg: TrainConfig, resume: bool) -> RunStatus:
    """The run folder's status; refuses to overwrite a checkpoint or to resume nothing."""
    status = run_status(cfg)
    out = status.out
    if resume and not status.has_train_state:
        raise ValueError(f"--resume: no training state in {out} (expected {out / TRAIN_STATE_FILE})")
    if resume and status.state == "new":
        raise ValueError(f"--resume: no checkpoint in {out} (expected {out / MODEL_FILE})")
    if not resume and status.state != "new":
        raise ValueError(f"{out} already holds a checkpoint: pass --resume to continue it, or choose another --out")
    return status


def _check_resume(status: RunStatus, tokenizer_json: str) -> None:
    """Refuses to resume a run whose model, data or tokenizer differ from the configuration's."""
    from spe.data.music import same_tokenizer

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


def _restore(out: Path, model: DecoderLM, optimizer: torch.optim.Optimizer, gens: _Generators,
             saved_step: int | None) -> int:
    """Loads weights, optimizer and random states of an interrupted run; returns its step."""
    from safetensors.torch import load_file

    state = load_file(str(out / MODEL_FILE))
    if model.config.tie_embeddings:
        state["head.weight"] = state["embed.weight"]
    model.load_state_dict(state)
    state_file = out / TRAIN_STATE_FILE
    try:
        ts = torch.load(state_file, weights_only=False)
    except Exception as err:  # noqa: BLE001 - a damaged file is a user-facing error
        raise ValueError(f"--resume: cannot read {state_file}: {err}") from None
    if ts["step"] != saved_step:
        raise ValueError(f"--resume: {state_file} is at step {ts['step']} but the checkpoint at step "
                         f"{saved_step}; the run was interrupted while saving")
    optimizer.load_state_dict(ts["optimizer"])
    torch.set_rng_state(ts["torch_rng"])  # dropout masks continue where they were
    gens.restore(ts)
    log.info("resuming %s at step %d", out, ts["step"])
    return ts["step"]


def _save(out: Path, model: DecoderLM, optimizer: torch.optim.Optimizer, gens: _Generators, step: int,
          meta: dict) -> None:
    """Checkpoint (weights + metadata), then the training state that resumes from it."""
    save(model, out, metadata=meta)
    ts = {"optimizer": optimizer.state_dict(), "step": step, **gens.states(), "torch_rng": torch.get_rng_state()}
    atomic_write(out / TRAIN_STATE_FILE, lambda tmp: torch.save(ts, tmp))


def _trim_metrics(metrics_path: Path, step: int) -> None:
    """Keeps only the records the checkpoint we start from has seen."""
    if metrics_path.exists():
        kept = [line for line in metrics_path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= step]
        metrics_path.write_text("".join(line + "\n" for line in kept))


def _data(cfg: TrainConfig, progress: bool):
    """The split, the crop sampler and the (N, L + 1) validation prefixes."""
    from spe.data.dataset import CropSampler, PitchShifter, prefix_batch
    from spe.data.music import make_tokenizer
    from spe.data.split import load_split

    split = load_split(cfg.data, cache_dir=cfg.cache_dir, val_fraction=cfg.val_fraction,
                       split_seed=cfg.split_seed, progress=progress)
    tokenizer = make_tokenizer()
    shifter = PitchShifter(tokenizer.vocab, cfg.max_transpose) if cfg.max_transpose > 0 else None
    sampler = CropSampler(split.train_pieces, cfg.seq_len, shifter)
    val_batch = prefix_batch(split.val_pieces, cfg.seq_len + 1)
    if len(val_batch) == 0:
        warnings.warn(f"no validation piece has {cfg.seq_len + 1} tokens: training runs without validation "
                      f"(lower --seq-len or raise val_fraction)", stacklevel=3)
    return split, len(tokenizer), sampler, val_batch


def build_model(cfg: TrainConfig, vocab_size: int) -> DecoderLM:
    """The model ``cfg`` trains, initialised from ``cfg.seed`` (the same weights for the same config)."""
    torch.manual_seed(cfg.seed)
    return DecoderLM(cfg.model_config(vocab_size))


def train(cfg: TrainConfig, *, resume: bool = False, progress: bool = True) -> Path:
    """Trains a decoder LM on REMI tokens and writes ``cfg.out/model.safetensors``.

    Args:
        cfg: the training configuration.
        resume: continue from ``cfg.out`` (model, optimizer, step, random states).
        progress: show a progress bar.

    Returns:
        The run folder.

    Raises:
        ValueError: on unusable data, a bad configuration, or a resume that does not match.
    """
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but PyTorch sees no CUDA device")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    status = _check_run(cfg, resume)
    split, vocab_size, sampler, val_batch = _data(cfg, progress)
    model = build_model(cfg, vocab_size).to(device)
    optimizer = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.98))
    gens = _Generators.seeded(cfg.seed)
    step = 0
    if resume:
        _check_resume(status, split.tokenizer_json)
        step = _restore(status.out, model, optimizer, gens, status.step)
    out = status.out
    out.mkdir(parents=True, exist_ok=True)
    meta = {"tokenizer": split.tokenizer_json, "train": cfg.to_dict(), "num_train_pieces": len(split.train_pieces),
            "num_val_pieces": len(split.val_pieces)}
    _trim_metrics(out / "metrics.jsonl", step)
    log.info("model: %s, %.2f M parameters; %d training / %d validation pieces",
             model.config.positional + "/" + model.config.attention, model.num_parameters() / 1e6,
             len(split.train_pieces), len(split.val_pieces))
    _loop(cfg, model, optimizer, gens, sampler, val_batch, step=step, meta=meta, progress=progress)
    _plot_losses(out / "metrics.jsonl", out / "loss.png")
    return out


def _loop(cfg: TrainConfig, model: DecoderLM, optimizer, gens: _Generators, sampler, val_batch, *, step: int,
          meta: dict, progress: bool) -> None:
    """Optimizer steps from ``step`` to ``cfg.steps``; validates and checkpoints every ``eval_every``."""
    from tqdm import tqdm

    out, device = Path(cfg.out), next(model.parameters()).device
    model.train()
    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {model.config.positional}", unit="step",
               disable=not progress, dynamic_ncols=True)
    tokens_seen, t0 = 0, time.perf_counter()
    while step < cfg.steps:
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * _lr_factor(step, cfg)
        if cfg.feature_redraw_every and step % cfg.feature_redraw_every == 0 and step:
            model.redraw_features(gens.feature)
        batch = sampler.sample(cfg.batch_size, gens.data).to(device)
        loss = model.loss(batch, generator=gens.code)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        step += 1
        tokens_seen += batch[:, 1:].numel()
        rate = tokens_seen / (time.perf_counter() - t0)
        bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{rate:,.0f}", refresh=False)
        bar.update(1)
        record = {"step": step, "loss": loss.item(), "lr": optimizer.param_groups[0]["lr"], "tokens_per_s": rate}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            val = validation_loss(model, val_batch, batch_size=cfg.batch_size, device=device) if len(val_batch) else None
            record["val_loss"] = val
            meta.update(step=step, val_loss=val)
            _save(out, model, optimizer, gens, step, meta)
            bar.write(f"step {step}: train {loss.item():.3f}, validation {val if val is None else round(val, 3)} nats/token")
        with open(out / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")
    bar.close()


def _plot_losses(metrics_path: Path, png: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional
        return
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], lw=0.6, alpha=0.6, label="training crops")
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    if val:
        ax.plot(*zip(*val), "o-", label="validation")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("Training")
    ax.legend()
    fig.tight_layout()
    atomic_write(png, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
