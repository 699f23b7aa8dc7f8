"""The training loop: AdamW, warmup + cosine, periodic validation, atomic resumable checkpoints."""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from pathlib import Path

import torch

from spe.checkpoint import MODEL_FILE, atomic_write, load_metadata, save
from spe.models.config import ModelConfig
from spe.models.decoder_lm import DecoderLM
from spe.train.config import TrainConfig

__all__ = ["TRAIN_STATE_FILE", "train"]

log = logging.getLogger(__name__)
TRAIN_STATE_FILE = "train_state.pt"


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
    from tqdm import tqdm

    from spe.data.dataset import CropSampler, PitchShifter, prefix_batch
    from spe.data.music import load_corpus, make_tokenizer, same_tokenizer

    out = Path(cfg.out)
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but PyTorch sees no CUDA device")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    state_file = out / TRAIN_STATE_FILE
    if resume and not state_file.exists():
        raise ValueError(f"--resume: no training state in {out} (expected {state_file})")
    if not resume and (out / MODEL_FILE).exists():
        raise ValueError(f"{out} already holds a checkpoint: pass --resume to continue it, or choose another --out")

    corpus = load_corpus(cfg.data, cache_dir=cfg.cache_dir, progress=progress)
    tokenizer = make_tokenizer()
    train_idx, val_idx = corpus.split(cfg.val_fraction, cfg.split_seed)
    train_pieces = [corpus.pieces[i] for i in train_idx]
    val_pieces = [corpus.pieces[i] for i in val_idx]
    shifter = PitchShifter(tokenizer.vocab, cfg.max_transpose) if cfg.max_transpose > 0 else None
    sampler = CropSampler(train_pieces, cfg.seq_len, shifter)
    val_batch = prefix_batch(val_pieces, cfg.seq_len + 1)
    if len(val_batch) == 0:
        warnings.warn(f"no validation piece has {cfg.seq_len + 1} tokens: training runs without validation "
                      f"(lower --seq-len or raise val_fraction)", stacklevel=2)

    torch.manual_seed(cfg.seed)
    model_cfg = ModelConfig(vocab_size=len(tokenizer), **cfg.model)
    model = DecoderLM(model_cfg).to(device)
    optimizer = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.98))
    data_gen = torch.Generator().manual_seed(cfg.seed)
    code_gen = torch.Generator().manual_seed(cfg.seed + 1)
    feature_gen = torch.Generator().manual_seed(cfg.seed + 2)
    step = 0
    if resume:
        saved = load_metadata(out)
        # older checkpoints lack newer fields: compare with their defaults filled in
        stored = ModelConfig.from_dict(saved["config"]).to_dict()
        changed = sorted(k for k, v in model_cfg.to_dict().items() if stored.get(k) != v)
        if changed:
            detail = ", ".join(f"{k} {stored.get(k)!r} -> {getattr(model_cfg, k)!r}" for k in changed)
            hint = " (pass --attention-window 0 to keep attending to the whole past)" \
                if changed == ["attention_window"] and stored.get("attention_window") is None else ""
            raise ValueError(f"--resume: the model configuration differs from the one in {out}: {detail}{hint}")
        before = saved.get("train", {})
        for key in ("data", "seq_len", "val_fraction", "split_seed", "max_transpose"):
            if key in before and before[key] != getattr(cfg, key):
                raise ValueError(f"--resume: {key} was {before[key]!r} in {out}, now {getattr(cfg, key)!r}")
        if saved.get("tokenizer") is not None and not same_tokenizer(saved["tokenizer"], corpus.tokenizer_json):
            raise ValueError(f"--resume: the tokenizer differs from the one in {out}")
        from safetensors.torch import load_file

        state = load_file(str(out / MODEL_FILE))
        if model_cfg.tie_embeddings:
            state["head.weight"] = state["embed.weight"]
        model.load_state_dict(state)
        try:
            ts = torch.load(state_file, weights_only=False)
        except Exception as err:  # noqa: BLE001 - a damaged file is a user-facing error
            raise ValueError(f"--resume: cannot read {state_file}: {err}") from None
        if ts["step"] != saved.get("step"):
            raise ValueError(f"--resume: {state_file} is at step {ts['step']} but the checkpoint at step "
                             f"{saved.get('step')}; the run was interrupted while saving")
        optimizer.load_state_dict(ts["optimizer"])
        step = ts["step"]
        torch.set_rng_state(ts["torch_rng"])  # dropout masks continue where they were
        data_gen.set_state(ts["data_gen"])
        code_gen.set_state(ts["code_gen"])
        feature_gen.set_state(ts["feature_gen"])
        log.info("resuming %s at step %d", out, step)

    out.mkdir(parents=True, exist_ok=True)
    meta = {"tokenizer": corpus.tokenizer_json, "train": cfg.to_dict(), "num_train_pieces": len(train_idx),
            "num_val_pieces": len(val_idx)}
    metrics_path = out / "metrics.jsonl"
    if metrics_path.exists():  # keep only what the checkpoint we start from has seen
        kept = [line for line in metrics_path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= step]
        metrics_path.write_text("".join(line + "\n" for line in kept))

    def checkpoint(val: float | None) -> None:
        meta.update(step=step, val_loss=val)
        save(model, out, metadata=meta)
        ts = {"optimizer": optimizer.state_dict(), "step": step, "data_gen": data_gen.get_state(),
              "code_gen": code_gen.get_state(), "feature_gen": feature_gen.get_state(),
              "torch_rng": torch.get_rng_state()}
        atomic_write(state_file, lambda tmp: torch.save(ts, tmp))

    log.info("model: %s, %.2f M parameters; %d training / %d validation pieces",
             model_cfg.positional + "/" + model_cfg.attention, model.num_parameters() / 1e6,
             len(train_idx), len(val_idx))
    model.train()
    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {model_cfg.positional}", unit="step",
               disable=not progress, dynamic_ncols=True)
    tokens_seen, t0 = 0, time.perf_counter()
    val = None
    while step < cfg.steps:
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * _lr_factor(step, cfg)
        if cfg.feature_redraw_every and step % cfg.feature_redraw_every == 0 and step:
            model.redraw_features(feature_gen)
        batch = sampler.sample(cfg.batch_size, data_gen).to(device)
        loss = model.loss(batch, generator=code_gen)
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
            checkpoint(val)
            bar.write(f"step {step}: train {loss.item():.3f}, validation {val if val is None else round(val, 3)} nats/token")
        with open(metrics_path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
    bar.close()
    _plot_losses(metrics_path, out / "loss.png")
    return out


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
