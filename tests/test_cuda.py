"""On CUDA, every kernel and model computes what the float64 CPU form computes.

Skipped without a GPU (CI has none); run on a lent device machine (docs/bench.md says when).
The CPU suite already ties every fast path to its float64 O(L²) reference; these tests tie
the CUDA float32 path to the CPU float64 one, so a CUDA-only branch (PyTorch's fused SDPA,
cuBLAS reductions, device-side gates) cannot drift unseen.

Tolerances: float32 carries a relative rounding of 2⁻²⁴ ≈ 6e-8 per operation; a logit here is
a chain of ~10 reductions over at most d_model = 32 or L ≤ 1,024 terms of order one, so its
error is bounded by about 32 · 1,024 · 6e-8 ≈ 2e-3 in the worst (aligned) case and ~√ of that
for random signs; 1e-4 absolute on O(1) logits (model tests, L = 48) and 2e-4 relative on the
kernels' outputs (L = 1,024) sit between the two. bf16 autocast rounds matrix products to
2⁻⁸ ≈ 4e-3 relative: the loss may move by a few hundredths of a nat, not more.
"""

import copy
import os

import pytest
import torch

from spe import DecoderLM, ModelConfig
from spe.attention.pro import PRO_OPTIONS
from spe.ops.decay import decay_attention_reference
from spe.ops.softmax.naive import gated_softmax_reference
from spe.ops.linear import causal_linear_attention
from spe.ops.softmax import softmax_attention

# SPE_TEST_DEVICE=cpu runs the same checks on the CPU's float32 path (to try them without a GPU).
DEVICE = torch.device(os.environ.get("SPE_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="needs CUDA")

# (positional, attention, extra options): the main job, the paper's variants, the peers and the
# gates study's layers (docs/gates.md), each with the kernel its plan row uses.
CASES = [
    ("sinespe", "performer", {}),
    ("sinespe", "performer", {"gated": True}),
    ("convspe", "performer", {}),
    ("sinespe", "linear-elu", {}),
    ("ape", "performer", {}),
    ("ape", "softmax", {}),
    ("rope", "performer", {}),
    ("shaw", "softmax", {}),
    ("music-relative", "softmax", {}),
    ("permute", "performer", {"decay": "gated"}),
    ("none", "performer", {"decay": "fixed"}),
    ("none", "performer", {"decay": "gated"}),
    ("none", "linear-elu", {"decay": "gated-channel"}),
    ("none", "softmax", {"decay": "gated"}),  # FoX
    ("none", "linear", {"decay": "gated"}),
    ("sinespe", "linear", {"decay": "gated"}),
    ("sinespe", "linear-elu", {"decay": "gated-channel", "short_conv": 4}),
    ("none", "softmax", {"decay": "gated", **dict.fromkeys(PRO_OPTIONS, True)}),  # FoX-Pro (docs/foxpro.md)
    ("sinespe", "linear", {"decay": "gated", **dict.fromkeys(PRO_OPTIONS, True)}),
    ("sinespe", "linear", {"decay": "gated", "spe_time": "learned"}),  # learned time
    ("sinespe", "performer", {"spe_time": "learned"}),
    ("rope", "linear-elu", {"rope_time": "learned", "decay": "gated-channel"}),
    # the onset clock, on a REMI-like vocabulary of bars and 4/4 positions (8 per beat)
    ("sinespe", "linear", {"decay": "gated", "spe_time": "onset", "onset_scale": 2.5,
                           "onset_tokens": {"Bar_None": 1, **{f"Position_{k}": 2 + k for k in range(32)}}}),
]


def _ids(case):
    pos, att, extra = case
    return "+".join([pos, att] + [f"{k}={v}" for k, v in extra.items() if k != "onset_tokens"])


def _model(pos, att, extra):
    torch.manual_seed(0)
    extra = {"gated": False, **extra}
    cfg = ModelConfig(vocab_size=50, d_model=32, num_layers=2, num_heads=2, d_ff=64, dropout=0.0,
                      positional=pos, attention=att, num_realizations=8, num_sines=2, kernel_size=6,
                      num_features=16, chunk_size=8, max_distance=6, max_positions=64, **extra)
    model = DecoderLM(cfg).eval()
    with torch.no_grad():  # learned clocks away from the index clock they start at
        for name, p in model.named_parameters():
            if ".clock." in name:
                p.normal_(0.0, 0.5)
    return model


def _pair(case):
    """The same weights as a float64 CPU model and a float32 CUDA model."""
    model = _model(*case)
    return copy.deepcopy(model).double(), model.to(DEVICE)


TOKENS = torch.randint(0, 50, (2, 48), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_cuda_forward_equals_the_float64_cpu_forward(case):
    ref, fast = _pair(case)
    with torch.no_grad():
        want = ref(TOKENS)
        got = fast(TOKENS.to(DEVICE)).double().cpu()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_cuda_gradients_equal_the_float64_cpu_gradients(case):
    """Training mode with one CPU generator: the SPE noise is drawn on the CPU and moved, so
    both devices see the same code and the same loss."""
    ref, fast = _pair(case)
    ref.train()
    fast.train()
    ref.loss(TOKENS, generator=torch.Generator().manual_seed(1)).backward()
    loss = fast.loss(TOKENS.to(DEVICE), generator=torch.Generator().manual_seed(1))
    loss.backward()
    for (name, p64), p32 in zip(ref.named_parameters(), fast.parameters()):
        if p64.grad is None:
            assert p32.grad is None, name
            continue
        scale = p64.grad.abs().max().item() + 1e-12
        err = (p32.grad.double().cpu() - p64.grad).abs().max().item()
        assert err <= 1e-3 * scale, f"{name}: {err:.2e} over a gradient of {scale:.2e}"


@pytest.mark.parametrize("case", [c for c in CASES if c[0] not in ("shaw", "music-relative")], ids=_ids)
def test_cuda_recurrent_decoding_equals_the_parallel_forward(case):
    _, fast = _pair(case)
    x = TOKENS[:, :24].to(DEVICE)
    with torch.no_grad():
        parallel = fast(x)
        state, steps = None, []
        for t in range(x.shape[1]):
            logits, state = fast.step(x[:, t], state)
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), parallel, atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", [CASES[0], CASES[11], CASES[13], CASES[-3]], ids=_ids)
def test_bf16_autocast_moves_the_loss_by_bf16_rounding_only(case):
    _, fast = _pair(case)
    fast.train()
    x = TOKENS.to(DEVICE)
    with torch.no_grad():
        full = fast.loss(x, generator=torch.Generator().manual_seed(2)).item()
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            half = fast.loss(x, generator=torch.Generator().manual_seed(2)).item()
    assert abs(half - full) < 0.05, (half, full)


def _gates(shape, generator):
    """Gates G ≤ 0 from mild (−0.01) to strong (−20 nats a step): the chunked channel kernel's
    exact branch (a chunk's sum below −60 nats) and its factored branch are both taken."""
    return -torch.nn.functional.softplus(4 * torch.randn(shape, generator=generator, dtype=torch.float64) - 2)


@pytest.mark.parametrize("channel", [False, True])
def test_cuda_gated_causal_linear_attention_equals_the_float64_sum(channel):
    g = torch.Generator().manual_seed(0)
    b, n, h, m, e = 1, 1024, 2, 16, 8
    phi_q = torch.rand(b, n, h, m, generator=g, dtype=torch.float64) * 3
    phi_k = torch.rand(b, n, h, m, generator=g, dtype=torch.float64) * 3
    v = torch.randn(b, n, h, e, generator=g, dtype=torch.float64) * 10
    gates = _gates((b, n, h, m) if channel else (b, n, h), g)
    want = decay_attention_reference(phi_q, phi_k, v, gates)
    args = [t.float().to(DEVICE).requires_grad_() for t in (phi_q, phi_k, v, gates)]
    got = causal_linear_attention(*args[:3], log_decay=args[3])
    scale = want.abs().max().item()
    assert (got.double().cpu() - want).abs().max().item() <= 2e-4 * scale
    # backward against the float64 reference's gradients
    ref = [t.clone().requires_grad_() for t in (phi_q, phi_k, v, gates)]
    w = torch.randn(want.shape, generator=g, dtype=torch.float64)
    (decay_attention_reference(*ref[:3], ref[3]) * w).sum().backward()
    (got * w.float().to(DEVICE)).sum().backward()
    for name, a, r in zip(("phi_q", "phi_k", "v", "gates"), args, ref):
        gscale = r.grad.abs().max().item()
        assert (a.grad.double().cpu() - r.grad).abs().max().item() <= 1e-3 * gscale, name


def test_cuda_fox_equals_the_float64_sum_with_sharp_attention():
    """FoX on CUDA (PyTorch's fused kernel with the gate's bias) at large query norms."""
    g = torch.Generator().manual_seed(1)
    b, n, h, d = 2, 512, 2, 32
    q = torch.randn(b, n, h, d, generator=g, dtype=torch.float64) * 4
    k = torch.randn(b, n, h, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, n, h, d, generator=g, dtype=torch.float64)
    gates = _gates((b, n, h), g) * 0.1
    want = gated_softmax_reference(q, k, v, gates)
    got = softmax_attention(*(t.float().to(DEVICE) for t in (q, k, v)), causal=True, log_decay=gates.float().to(DEVICE))
    torch.testing.assert_close(got.double().cpu(), want, atol=2e-4 * want.abs().max().item(), rtol=0)
