"""--precision: bf16 autocast on CPU trains close to fp32; checkpoints stay float32; fp16 needs CUDA."""

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import tiny_config

from spe.checkpoint import MODEL_FILE
from spe.lab.music.config import TrainConfig
from spe.lab.engine.precision import autocast, check_precision, grad_scaler
from spe.lab.music.task import build_model


def _loss(model, batch, precision):
    with autocast(precision, "cpu"):
        logits = model(batch[:, :-1], generator=torch.Generator().manual_seed(3))
    flat = logits.float().reshape(-1, logits.shape[-1])
    return torch.nn.functional.cross_entropy(flat, batch[:, 1:].reshape(-1))


def test_a_bf16_step_is_close_to_fp32_on_the_same_batch(tmp_path):
    cfg = tiny_config(tmp_path, "unused", model={"dropout": 0.0})  # sineSPE + Performer, the main model
    model = build_model(cfg, vocab_size=300)
    model.head.weight.data.mul_(20.0)  # logits of a trained model's size, not the ~0 of initialisation
    batch = torch.randint(0, 300, (4, 33), generator=torch.Generator().manual_seed(0))
    fp32, bf16 = _loss(model, batch, "fp32").detach(), _loss(model, batch, "bf16")
    # bf16 keeps 8 significant bits: a rounded matrix-product input is off by up to u = 2^-8
    # relative (uniformly, rms u/√3), so a logit z is off by about u·|z|/√3 rms. A token's
    # cross-entropy log Σ exp z − z_y moves by the error of z_y and of the log-sum-exp
    # (a softmax-weighted mean of errors): rms ≈ √2·u·z_rms/√3. The mean over n = B·L tokens
    # of independent errors has σ = that / √n; we allow 6σ (the run is seeded, so the check is
    # deterministic). Here σ ≈ 7e-4 nats on a loss of 12; measured |Δ| = 1.0e-3 (1.5σ).
    u = 2.0 ** -8
    with torch.no_grad():
        z_rms = float(model(batch[:, :-1]).pow(2).mean().sqrt())
    n = batch[:, 1:].numel()
    tol = 6 * (2 / 3) ** 0.5 * u * z_rms / n ** 0.5
    assert abs(bf16.item() - fp32.item()) <= tol, (fp32.item(), bf16.item(), tol)
    assert bf16.item() != fp32.item()  # bf16 really computed something in bf16
    bf16.backward()
    assert all(p.grad.dtype == torch.float32 and p.dtype == torch.float32 for p in model.parameters()
               if p.grad is not None)


@pytest.mark.slow
def test_bf16_training_writes_float32_checkpoints(tmp_path):
    from spe.lab.music.train import train

    run = train(tiny_config(tmp_path, "bf16", steps=2, precision="bf16"), progress=False)
    weights = load_file(str(run / MODEL_FILE))
    assert {t.dtype for t in weights.values()} == {torch.float32}
    assert all(torch.isfinite(t).all() for t in weights.values())


def test_fp16_is_refused_on_cpu_and_unknown_precisions_are_named():
    with pytest.raises(ValueError, match="fp16 needs a CUDA device.*bf16"):
        TrainConfig(precision="fp16")
    with pytest.raises(ValueError, match="'fp8'"):
        check_precision("fp8", "cpu")
    assert not grad_scaler("bf16", "cpu").is_enabled()
