"""On CUDA, every kernel and model computes what the float64 CPU form computes.

Skipped without a GPU (CI has none); run on a CUDA machine (scripts/cuda_check.sh; results in docs/bench/).
The CPU suite already ties every fast path to its float64 O(L²) reference; these tests tie
the CUDA float32 path to the CPU float64 one, so a CUDA-only branch (PyTorch's fused SDPA,
cuBLAS reductions, device-side gates, FlexAttention for FoX and the score encodings it takes)
cannot drift unseen.

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
    ("alibi", "softmax", {}),  # on CUDA, as music-relative and FoX: through FlexAttention (softmax_impl auto)
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


@pytest.mark.parametrize("case", [c for c in CASES if c[2].get("spe_time") == "learned"], ids=_ids)
def test_cuda_compiled_timed_product_gives_the_float64_cpu_gradients(case, monkeypatch):
    """The learned-time product with its elementwise passes compiled (spe.ops.sine.timed.COMPILE,
    what spe train --compile turns on; Triton on a GPU): the same gradients as float64."""
    from spe.ops.sine import timed

    monkeypatch.setitem(timed.COMPILE, DEVICE.type, True)
    monkeypatch.setattr(timed, "_COMPILED", {})
    monkeypatch.setattr(timed, "_COMPILE_FAILED", [])
    test_cuda_gradients_equal_the_float64_cpu_gradients(case)
    assert set(timed._COMPILED) == {"_features", "_feature_grads"} and not timed._COMPILE_FAILED


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


# FlexAttention (spe.ops.softmax.flex): its backward runs on CUDA only, so these tie it to the
# per-block form there, forward and backward, and to the float64 CPU sums. Same tolerances as
# above: both are float32 paths (2e-4 relative on outputs, 1e-3 on gradients, ~L·2⁻²⁴ apart).
needs_cuda_flex = pytest.mark.skipif(DEVICE.type != "cuda", reason="FlexAttention's backward runs on CUDA only")


def _flex_inputs(seed, *, b=2, n=300, h=2, d=32, gated=True):
    """q, k, v (n = 300: three of FlexAttention's 128-blocks, the last partial) and FoX gates,
    in float64 on the CPU."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, h, d, generator=g, dtype=torch.float64) for _ in range(3))
    return q, k, v, (_gates((b, n, h), g) * 0.1 if gated else None)


def _grads_of(fn, tensors, weights):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    (out * weights.to(out)).sum().backward()
    return out.detach(), [t.grad for t in leaves]


def _close(got, want, rel, name):
    scale = want.abs().max().item() + 1e-12
    err = (got.double().cpu() - want.double().cpu()).abs().max().item()
    assert err <= rel * scale, f"{name}: {err:.2e} over {scale:.2e}"


@needs_cuda_flex
@pytest.mark.parametrize("window", [None, 50])
def test_cuda_flex_fox_equals_the_per_block_form_forward_and_backward(window):
    from spe.ops.softmax import flex_softmax_attention, softmax_attention_reference

    q, k, v, gates = _flex_inputs(0)
    w = torch.randn(q.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    inputs = [t.float().to(DEVICE) for t in (q, k, v, gates)]
    flex, flex_grads = _grads_of(lambda *a: flex_softmax_attention(*a[:3], causal=True, window=window,
                                                                   log_decay=a[3]), inputs, w)
    blocks, block_grads = _grads_of(lambda *a: softmax_attention(*a[:3], causal=True, window=window,
                                                                 log_decay=a[3]), inputs, w)
    ref, ref_grads = _grads_of(lambda *a: softmax_attention_reference(*a[:3], causal=True, window=window,
                                                                      log_decay=a[3]), [q, k, v, gates], w)
    _close(flex, blocks, 2e-4, "output vs per-block")
    _close(flex, ref, 2e-4, "output vs float64")
    for name, a, bl, r in zip(("q", "k", "v", "log_decay"), flex_grads, block_grads, ref_grads):
        _close(a, bl, 1e-3, f"d{name} vs per-block")
        _close(a, r, 1e-3, f"d{name} vs float64")


@needs_cuda_flex
def test_cuda_flex_fox_gradients_over_a_running_sum_of_ten_thousand_nats():
    """The gate's two float32 parts (spe.ops.softmax.flex) in backward: a −10⁴ gate early on."""
    from spe.ops.softmax import flex_softmax_attention, softmax_attention_reference

    q, k, v, gates = _flex_inputs(1)
    gates[:, 1] = -1e4
    w = torch.randn(q.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    flex, grads = _grads_of(lambda *a: flex_softmax_attention(*a[:3], causal=True, log_decay=a[3]),
                            [t.float().to(DEVICE) for t in (q, k, v, gates)], w)
    ref, ref_grads = _grads_of(lambda *a: softmax_attention_reference(*a[:3], causal=True, log_decay=a[3]),
                               [q, k, v, gates], w)
    _close(flex, ref, 2e-4, "output")
    for name, a, r in zip(("q", "k", "v", "log_decay"), grads, ref_grads):
        _close(a, r, 1e-3, f"d{name}")


@needs_cuda_flex
@pytest.mark.parametrize("causal", [True, False])
def test_cuda_flex_distance_slopes_equal_the_score_encoding_forward_and_backward(causal):
    from spe.encodings.alibi import ALiBi
    from spe.ops.softmax import flex_softmax_attention

    q, k, v, _ = _flex_inputs(2, gated=False)
    term = ALiBi(q.shape[2], causal=causal).to(DEVICE)
    w = torch.randn(q.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    inputs = [t.float().to(DEVICE) for t in (q, k, v)]
    flex, grads = _grads_of(lambda *a: flex_softmax_attention(*a, **term.flex_arguments(a[0])), inputs, w)
    blocks, block_grads = _grads_of(lambda *a: term.attend(*a), inputs, w)
    _close(flex, blocks, 2e-4, "output")
    for name, a, bl in zip("qkv", grads, block_grads):
        _close(a, bl, 1e-3, f"d{name}")


@needs_cuda_flex
@pytest.mark.parametrize("causal", [True, False])
def test_cuda_flex_relative_scores_equal_the_score_encoding_forward_and_backward(causal):
    """Relative key embeddings (k = 20 over 300 positions) through the score_mod: the gradient
    reaches q both directly and through the table's scores, and the embeddings."""
    from spe.encodings.music_relative import MusicRelativePosition
    from spe.ops.softmax import flex_softmax_attention

    q, k, v, _ = _flex_inputs(4, gated=False)
    term = MusicRelativePosition(q.shape[2], q.shape[3], 20, causal=causal).to(DEVICE)
    with torch.no_grad():
        term.embeddings.normal_()
    w = torch.randn(q.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    inputs = [t.float().to(DEVICE) for t in (q, k, v)]
    flex, grads = _grads_of(lambda *a: flex_softmax_attention(*a, **term.flex_arguments(a[0])), inputs, w)
    table_grad = term.embeddings.grad.clone()
    term.embeddings.grad = None
    blocks, block_grads = _grads_of(lambda *a: term.attend(*a), inputs, w)
    _close(flex, blocks, 2e-4, "output")
    for name, a, bl in zip("qkv", grads, block_grads):
        _close(a, bl, 1e-3, f"d{name}")
    _close(table_grad, term.embeddings.grad, 1e-3, "dembeddings")


@needs_cuda_flex
def test_cuda_fox_model_routes_through_flex_and_equals_the_per_block_model(monkeypatch):
    """A whole FoX model (softmax + decay gated) through the layer's dispatch: softmax_impl
    'auto' takes FlexAttention on CUDA (counted), and its loss and every gradient equal those of
    the same model with 'blocks'."""
    import spe.attention.kernels as kernels
    from spe.attention.kernels import set_softmax_impl

    calls = []
    real = kernels.flex_softmax_attention
    monkeypatch.setattr(kernels, "flex_softmax_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    flex = _model("none", "softmax", {"decay": "gated"}).to(DEVICE).train()
    blocks = copy.deepcopy(flex)
    set_softmax_impl(blocks, "blocks")
    losses = []
    for model in (flex, blocks):
        loss = model.loss(TOKENS.to(DEVICE))
        loss.backward()
        losses.append(loss.item())
    from spe.ops.softmax.flex import auto_flex_failure

    assert auto_flex_failure() is None  # flex ran (no fallback after a compiler error)
    assert len(calls) == 2  # two layers, once each; none for the per-block model
    assert abs(losses[0] - losses[1]) <= 1e-5 * abs(losses[1])
    for (name, a), b in zip(flex.named_parameters(), blocks.parameters()):
        assert (a.grad is None) == (b.grad is None), name
        if a.grad is not None:
            _close(a.grad, b.grad, 1e-3, name)


@needs_cuda_flex
def test_cuda_flex_bf16_stays_within_bf16_rounding_of_the_float64_sums():
    from spe.ops.softmax import flex_softmax_attention, softmax_attention_reference

    q, k, v, gates = _flex_inputs(3)
    got = flex_softmax_attention(*(t.to(DEVICE, torch.bfloat16) for t in (q, k, v)), causal=True,
                                 log_decay=gates.float().to(DEVICE))
    assert got.dtype == torch.bfloat16
    _close(got, softmax_attention_reference(q, k, v, causal=True, log_decay=gates), 3e-2, "bf16 output")


@needs_cuda_flex
def test_cuda_auto_takes_flex_for_what_the_fused_causal_kernel_cannot_do_only():
    from spe.encodings.alibi import ALiBi
    from spe.ops.softmax.flex import choose_softmax_impl

    q = torch.zeros(1, 256, 2, 32, device=DEVICE)
    gate = torch.zeros(1, 256, 2, device=DEVICE)
    assert choose_softmax_impl("auto", q, q, q) == "blocks"  # plain causal: PyTorch's fused kernel
    assert choose_softmax_impl("auto", q, q, q, window=256) == "blocks"  # a window as long as the sequence
    assert choose_softmax_impl("auto", q, q, q, window=64) == "flex"
    assert choose_softmax_impl("auto", q, q, q, log_decay=gate) == "flex"
    assert choose_softmax_impl("auto", q, q, q, score_term=ALiBi(2)) == "flex"
    assert choose_softmax_impl("auto", q, q, q, score_term=object()) == "blocks"  # forms its scores itself
    assert choose_softmax_impl("flex", q, q, q) == "flex"
    assert choose_softmax_impl("auto", q.double(), q.double(), q.double(), log_decay=gate) == "blocks"
