"""Softmax attention through FlexAttention (spe.ops.softmax.flex), on the CPU: its eager forward
against the float64 O(L²) reference (FoX's gate, causality, a window, ALiBi, key padding), FoX's
bias over a running sum of thousands of nats, the choice between flex and the per-block form,
and a whole layer through the dispatch. FlexAttention's backward does not run on the CPU
(PyTorch 2.13): forward and backward on CUDA are in tests/test_cuda.py.

Tolerance: float32 logits of O(1) (D = 16, unit entries) and softmax sums over ≤ 200 keys carry
rounding errors of a few 2⁻²⁴ ≈ 6e-8 each; 1e-5 on O(1) outputs is ~20× the largest seen (7e-7)
and ~50× below what the FoX bias of a float32 running sum loses at 10⁴ nats (6e-4).
"""

import warnings

import pytest
import torch

from spe.attention.kernels import set_softmax_impl
from spe.attention.layer import MultiHeadAttention
from spe.encodings.alibi import ALiBi
from spe.encodings.music_relative import MusicRelativePosition
from spe.ops.softmax import softmax_attention, softmax_attention_reference
from spe.ops.softmax.flex import (
    check_softmax_impl,
    choose_softmax_impl,
    flex_available,
    flex_fallback_reason,
    flex_softmax_attention,
)

B, L, H, D = 2, 200, 3, 16  # L > 128: more than one of FlexAttention's blocks, and not a multiple
TOL = 1e-5


def _eager_forward_runs() -> str | None:
    if not flex_available():
        return "this PyTorch has no torch.nn.attention.flex_attention"
    try:
        with torch.no_grad():
            flex_softmax_attention(*(torch.randn(1, 4, 1, 16) for _ in range(3)), compile=False)
    except Exception as e:  # noqa: BLE001 - any failure of the eager forward means: nothing to test here
        return f"FlexAttention's eager forward does not run here: {type(e).__name__}: {e}"
    return None


_SKIP = _eager_forward_runs()
needs_flex = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


def _qkv(seed=0, n=L):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, n, H, D, generator=g) for _ in range(3)], g


@needs_flex
@pytest.mark.parametrize("window", [None, 37])
@pytest.mark.parametrize("gate", ["per-position", "constant", "none"])
@torch.no_grad()
def test_flex_fox_forward_equals_the_float64_reference(window, gate):
    (q, k, v), g = _qkv()
    log_decay = {"per-position": -0.3 * torch.rand(B, L, H, generator=g),
                 "constant": -0.1 * torch.rand(H, generator=g), "none": None}[gate]
    got = flex_softmax_attention(q, k, v, causal=True, window=window, log_decay=log_decay)
    want = softmax_attention_reference(q, k, v, causal=True, window=window, log_decay=log_decay)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=TOL, rtol=0)


@needs_flex
@torch.no_grad()
def test_flex_fox_keeps_float32_precision_over_a_running_sum_of_ten_thousand_nats():
    """A gate of −10⁴ at position 1 puts every later running sum near −10⁴, where float32's
    spacing is 10⁻³: the bias c_m − c_n of two float32 sums would be off by ~6e-4 nats (and
    the output by as much); c kept as two float32 parts is exact to float32 on the difference."""
    (q, k, v), g = _qkv(1)
    log_decay = -0.3 * torch.rand(B, L, H, generator=g)
    log_decay[:, 1] = -1e4
    got = flex_softmax_attention(q, k, v, causal=True, log_decay=log_decay)
    want = softmax_attention_reference(q, k, v, causal=True, log_decay=log_decay)
    torch.testing.assert_close(got.double(), want, atol=TOL, rtol=0)


@needs_flex
@pytest.mark.parametrize("causal", [True, False])
@torch.no_grad()
def test_flex_alibi_forward_equals_alibi_attend_in_float64(causal):
    (q, k, v), _ = _qkv(2)
    alibi = ALiBi(H, causal=causal)
    mask = None
    if not causal:  # padding at the end of one sequence: those keys get no weight
        mask = torch.zeros(B, L, dtype=torch.bool)
        mask[0, -23:] = True
    got = flex_softmax_attention(q, k, v, key_padding_mask=mask, **alibi.flex_arguments(q))
    want = alibi.attend(q.double(), k.double(), v.double(), key_padding_mask=mask)
    torch.testing.assert_close(got.double(), want, atol=TOL, rtol=0)


@needs_flex
@pytest.mark.parametrize("causal", [True, False])
@torch.no_grad()
def test_flex_relative_scores_equal_relative_key_attention_in_float64(causal):
    """Relative key embeddings clipped at k = 6 over 200 positions (most pairs clipped), the
    table's scores per query and column as the score_mod reads them."""
    (q, k, v), _ = _qkv(7)
    term = MusicRelativePosition(H, D, 6, causal=causal).double()
    with torch.no_grad():
        term.embeddings.normal_()  # O(1) relative scores, not the 0.02 of initialisation
    mask = None
    if not causal:
        mask = torch.zeros(B, L, dtype=torch.bool)
        mask[1, -31:] = True
    got = flex_softmax_attention(q, k, v, key_padding_mask=mask, **term.float().flex_arguments(q))
    want = term.double().attend(q.double(), k.double(), v.double(), key_padding_mask=mask)
    torch.testing.assert_close(got.double(), want, atol=TOL, rtol=0)


@needs_flex
@torch.no_grad()
def test_flex_plain_attention_is_causal_and_ignores_future_tokens():
    (q, k, v), _ = _qkv(3)
    out = flex_softmax_attention(q, k, v, causal=True)
    torch.testing.assert_close(out.double(), softmax_attention_reference(q, k, v, causal=True), atol=TOL, rtol=0)
    k2, v2 = k.clone(), v.clone()
    k2[:, 120:], v2[:, 120:] = torch.randn_like(k2[:, 120:]), torch.randn_like(v2[:, 120:])
    torch.testing.assert_close(flex_softmax_attention(q, k2, v2, causal=True)[:, :120], out[:, :120], atol=0, rtol=0)


@needs_flex
@pytest.mark.slow
@torch.no_grad()
def test_the_compiled_call_equals_the_float64_reference():
    """The path CUDA takes (torch.compile of the call, the biases as its arguments), forward on
    the CPU's inductor backend; a second gate of another length reuses the compiled function."""
    for n, window in ((L, 37), (130, None)):
        (q, k, v), g = _qkv(6, n)
        log_decay = -0.3 * torch.rand(B, n, H, generator=g)
        got = flex_softmax_attention(q, k, v, causal=True, window=window, log_decay=log_decay, compile=True)
        want = softmax_attention_reference(q, k, v, causal=True, window=window, log_decay=log_decay)
        torch.testing.assert_close(got.double(), want, atol=TOL, rtol=0)


def test_flex_validation_errors():
    q = torch.zeros(1, 4, 2, 16)
    with pytest.raises(ValueError, match="window needs causal"):
        flex_softmax_attention(q, q, q, causal=False, window=2)
    with pytest.raises(ValueError, match="needs causal attention"):
        flex_softmax_attention(q, q, q, causal=False, log_decay=torch.zeros(1, 4, 2))
    with pytest.raises(ValueError, match="distance_slopes"):
        flex_softmax_attention(q, q, q, distance_slopes=torch.ones(3))
    with pytest.raises(ValueError, match="relative_scores must be"):
        flex_softmax_attention(q, q, q, relative_scores=torch.zeros(1, 4, 2, 3), max_distance=3)
    with pytest.raises(ValueError, match="relative_scores must be"):
        flex_softmax_attention(q, q, q, relative_scores=torch.zeros(1, 4, 2, 3))
    with pytest.raises(ValueError, match="key_padding_mask is for non-causal"):
        flex_softmax_attention(q, q, q, causal=True, key_padding_mask=torch.zeros(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="softmax_impl must be one of auto, flex, blocks"):
        check_softmax_impl("triton")


def test_the_choice_keeps_the_per_block_form_on_the_cpu_and_says_why_flex_cannot_run():
    q = torch.zeros(1, 4, 2, 16)
    assert choose_softmax_impl("auto", q, q, q) == "blocks"  # the CPU's default
    assert choose_softmax_impl("blocks", q, q, q) == "blocks"
    assert flex_fallback_reason(q.double(), q.double(), q.double()).startswith("float64")
    assert "score term object" in flex_fallback_reason(q, q, q, score_term=object())
    grad = q.clone().requires_grad_()
    if flex_available():
        assert flex_fallback_reason(q, q, q, score_term=ALiBi(2)) is None  # ALiBi maps to a score_mod
        assert "backward does not run on the CPU" in flex_fallback_reason(grad, q, q)
        with torch.no_grad():  # no gradient, no obstacle
            assert flex_fallback_reason(grad, q, q) is None
    with pytest.warns(UserWarning, match="softmax_impl='flex' falls back to the per-block softmax"):
        choose_softmax_impl("flex", q.double(), q.double(), q.double().requires_grad_())
    with pytest.raises(ValueError, match="softmax_impl"):
        choose_softmax_impl("fast", q, q, q)


def test_a_flex_failure_under_auto_turns_flex_off_with_a_warning_and_propagates_when_asked_for(monkeypatch):
    import spe.ops.softmax.flex as flex

    monkeypatch.setattr(flex, "_AUTO_FAILURE", [])

    def broken():
        raise RuntimeError("cannot lower this score_mod\nmore detail")

    def refused():
        raise ValueError("a bad window")

    with pytest.raises(RuntimeError, match="cannot lower"):
        flex.run_flex("flex", broken)
    with pytest.raises(ValueError, match="a bad window"):  # the caller's error, whatever the path
        flex.run_flex("auto", refused)
    assert flex.auto_flex_failure() is None
    with pytest.warns(UserWarning, match="FlexAttention failed .RuntimeError: cannot lower this score_mod.: "
                                         "softmax_impl='auto' keeps the per-block softmax"):
        assert flex.run_flex("auto", broken) is None
    assert flex.auto_flex_failure() == "RuntimeError: cannot lower this score_mod"
    assert flex.run_flex("auto", lambda: 1) == 1


def _fox_layer(impl, positional=None, decay="gated"):
    torch.manual_seed(0)
    return MultiHeadAttention(2 * D, 2, attention="softmax", decay=decay, positional=positional,
                              softmax_impl=impl).eval()


@needs_flex
@torch.no_grad()
def test_a_fox_layer_through_flex_equals_the_per_block_layer():
    x = torch.randn(B, 150, 2 * D, generator=torch.Generator().manual_seed(4))
    flex, blocks = _fox_layer("flex"), _fox_layer("blocks")
    torch.testing.assert_close(flex(x), blocks(x), atol=TOL, rtol=0)
    flex.window = blocks.window = 40
    torch.testing.assert_close(flex(x), blocks(x), atol=TOL, rtol=0)
    alibi_flex, alibi_blocks = (_fox_layer(impl, ALiBi(2), decay="none") for impl in ("flex", "blocks"))
    torch.testing.assert_close(alibi_flex(x), alibi_blocks(x), atol=TOL, rtol=0)
    music_flex, music_blocks = (_fox_layer(impl, MusicRelativePosition(2, D, 20), decay="none")
                                for impl in ("flex", "blocks"))
    torch.testing.assert_close(music_flex(x), music_blocks(x), atol=TOL, rtol=0)


def test_a_forced_flex_layer_with_gradients_on_the_cpu_falls_back_to_the_per_block_form():
    x = torch.randn(1, 20, 2 * D, generator=torch.Generator().manual_seed(5))
    flex, blocks = _fox_layer("flex"), _fox_layer("blocks")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        got = flex(x)  # parameters require grad: flex cannot take it here
    got.sum().backward()
    assert flex.qkv.weight.grad is not None
    torch.testing.assert_close(got, blocks(x), atol=0, rtol=0)


def test_set_softmax_impl_reaches_every_attention_layer():
    from spe import DecoderLM, ModelConfig

    model = DecoderLM(ModelConfig(vocab_size=11, d_model=32, num_layers=3, num_heads=2, d_ff=32,
                                  positional="none", attention="softmax", decay="gated"))
    assert set_softmax_impl(model, "blocks") == 3
    assert {m.softmax_impl for m in model.modules() if isinstance(m, MultiHeadAttention)} == {"blocks"}
    with pytest.raises(ValueError, match="softmax_impl"):
        set_softmax_impl(model, "fast")
    with pytest.raises(ValueError, match="softmax_impl"):
        MultiHeadAttention(32, 2, attention="softmax", softmax_impl="fast")
