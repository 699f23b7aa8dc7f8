"""MultiHeadAttention.attention_weights: the (B, H, L, L) matrix the layer applies, and the R of SPE codes.

A v (v the layer's projected values) through the layer's output (RMS norm of ``linear``, output
projection) must give the layer's forward; causal rows see no future key, padding columns are 0,
normalising kernels' rows sum to 1; ``exact`` is the softmax of q̂·k̂ with the layer's decay.
"""

import math

import pytest
import torch

from spe.attention import MultiHeadAttention
from spe.encodings import ALiBi, MusicRelativePosition, RotaryEncoding, SineSPE, SPEFilter

B, L, C, H = 2, 9, 16, 2
D = C // H
R = 6
LINEAR = ("performer", "linear-relu", "linear-elu", "linear")
KERNELS = ("softmax", *LINEAR)


def _inputs(dtype=torch.float32, seed=1):
    return torch.randn(B, L, C, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _stir(layer):
    """Gates and learned decays away from their initial values, so that they matter."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "decay" in name:
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype))


def _layer(attention, positional="none", *, decay="none", causal=True, dtype=torch.float32):
    torch.manual_seed(0)
    kw = {}
    if positional == "sinespe":
        kw = dict(positional=SPEFilter(H, D), num_realizations=R)
    elif positional == "rope":
        kw = dict(positional=RotaryEncoding())
    elif positional == "alibi":
        kw = dict(positional=ALiBi(H, causal=causal))
    elif positional == "music-relative":
        kw = dict(positional=MusicRelativePosition(H, D, 4, causal=causal))
    layer = MultiHeadAttention(C, H, attention=attention, causal=causal, decay=decay, num_features=8,
                               chunk_size=4, **kw).to(dtype).eval()
    _stir(layer)
    if positional == "music-relative":
        with torch.no_grad():  # away from its small initial values, so the term matters
            layer.score_encoding.embeddings.normal_()
    return layer


def _code(layer, dtype=torch.float32):
    if layer.spe_filter is None:
        return None
    torch.manual_seed(5)
    code = SineSPE(H, D, R, num_sines=2)(L, generator=torch.Generator().manual_seed(4))
    return type(code)(**{k: v.to(dtype) for k, v in vars(code).items()})


def _through_the_output(layer, weights, x, code, mask=None):
    """The layer's output from A: A v, then the RMS norm (``linear``) and the output projection."""
    _, _, v = layer.project(x, code, key_padding_mask=mask)  # (B, L, H, D)
    return layer._output(torch.einsum("bhmn,bnhd->bmhd", weights.to(v.dtype), v))


def _tolerance(dtype, y):
    # A v sums L products in another order than the kernel's (chunked) sums: at worst L roundings
    # of u = eps/2 relative to the largest output; the output projection's C terms add C more
    # (the kernel rounds its own sums too: hence eps, 2u, per term).
    return (L + C) * torch.finfo(dtype).eps * float(y.abs().max())


CASES = [(kernel, "none", "none") for kernel in KERNELS] + [
    (kernel, "sinespe", "none") for kernel in KERNELS] + [
    ("softmax", "rope", "none"), ("performer", "rope", "none"), ("linear-elu", "rope", "none"),
    ("softmax", "alibi", "none"), ("softmax", "music-relative", "none"),
    ("softmax", "none", "gated"), ("performer", "none", "fixed"), ("performer", "sinespe", "gated"),
    ("linear-elu", "none", "learned"), ("linear-relu", "none", "gated-channel"), ("linear", "none", "gated"),
    ("linear-elu", "rope", "gated-channel")]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("attention,positional,decay", CASES)
def test_the_weights_times_the_values_are_the_layers_output(attention, positional, decay, dtype):
    layer = _layer(attention, positional, decay=decay, dtype=dtype)
    x, code = _inputs(dtype), _code(layer, dtype)
    with torch.no_grad():
        weights = layer.attention_weights(x, code)
        y = layer(x, code)
        got = _through_the_output(layer, weights, x, code)
    assert weights.shape == (B, H, L, L) and weights.dtype == dtype
    torch.testing.assert_close(got, y, rtol=0, atol=_tolerance(dtype, y))
    # causal: no weight after the query
    assert torch.all(weights[..., torch.ones(L, L, dtype=torch.bool).triu(1)] == 0)


@pytest.mark.parametrize("attention,positional,decay", [
    ("softmax", "none", "none"), ("softmax", "sinespe", "none"), ("softmax", "alibi", "none"),
    ("softmax", "music-relative", "none"), ("performer", "none", "fixed"), ("performer", "sinespe", "gated"),
    ("linear-relu", "none", "gated-channel"), ("linear-elu", "none", "none"), ("linear", "sinespe", "fixed"),
    ("linear-elu", "rope", "none")])
@pytest.mark.slow
def test_padding_keys_get_no_weight_in_an_encoder(attention, positional, decay):
    layer = _layer(attention, positional, decay=decay, causal=False, dtype=torch.float64)
    x, code = _inputs(torch.float64), _code(layer, torch.float64)
    mask = torch.arange(L)[None] >= torch.tensor([L, 5])[:, None]  # (B, L): example 1 has 5 real tokens
    with torch.no_grad():
        weights = layer.attention_weights(x, code, key_padding_mask=mask)
        y = layer(x, code, key_padding_mask=mask)
        got = _through_the_output(layer, weights, x, code, mask)
        # what a padded position holds never reaches a real query
        x2 = x.clone()
        x2[1, 5:] = torch.randn(L - 5, C, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
        moved = layer.attention_weights(x2, code, key_padding_mask=mask)
    torch.testing.assert_close(got, y, rtol=0, atol=_tolerance(torch.float64, y))
    assert torch.all(weights[1, :, :, 5:] == 0)
    torch.testing.assert_close(moved[1, :, :5], weights[1, :, :5], rtol=0, atol=1e-12)


@pytest.mark.slow
def test_causal_rows_do_not_see_the_future():
    """Changing the inputs from position t on leaves the rows of queries before t unchanged."""
    for attention, decay in (("softmax", "gated"), ("performer", "fixed"), ("linear-relu", "gated-channel")):
        layer = _layer(attention, decay=decay, dtype=torch.float64)
        x = _inputs(torch.float64)
        x2 = x.clone()
        x2[:, 5:] += 1.0
        with torch.no_grad():
            a, b = layer.attention_weights(x), layer.attention_weights(x2)
        torch.testing.assert_close(a[:, :, :5], b[:, :, :5], rtol=0, atol=1e-12)
        assert (a[:, :, 5:] - b[:, :, 5:]).abs().max() > 1e-6


@pytest.mark.parametrize("attention", ["softmax", "performer", "linear-elu"])
@pytest.mark.parametrize("causal", [True, False])
def test_normalising_kernels_rows_sum_to_one(attention, causal):
    layer = _layer(attention, "sinespe", decay="none" if attention == "softmax" else "gated", causal=causal,
                   dtype=torch.float64)
    with torch.no_grad():
        weights = layer.attention_weights(_inputs(torch.float64), _code(layer, torch.float64))
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, L, dtype=torch.float64), rtol=0, atol=1e-12)
    assert (weights >= 0).all()


def test_a_window_keeps_the_last_w_keys():
    layer = _layer("linear-elu", dtype=torch.float64)
    layer.window = 3
    with torch.no_grad():
        weights = layer.attention_weights(_inputs(torch.float64))
    lag = torch.arange(L)[:, None] - torch.arange(L)[None, :]
    assert torch.all(weights[..., (lag < 0) | (lag >= 3)] == 0)
    assert torch.all(weights[..., (lag >= 0) & (lag < 3)] > 0)


def test_linear_kernels_weights_are_the_formula():
    """elu + 1 features with RetNet's decay: A_mn = γ^{m−n} φ(q_m)·φ(k_n) / Σ_n' γ^{m−n'} φ(q_m)·φ(k_n');
    ``linear``: γ^{m−n} q_m·k_n, unnormalised."""
    x = _inputs(torch.float64)
    lag = (torch.arange(L)[:, None] - torch.arange(L)[None, :]).double()
    for attention, phi in (("linear-elu", lambda t: torch.nn.functional.elu(t) + 1), ("linear", lambda t: t)):
        layer = _layer(attention, decay="fixed", dtype=torch.float64)
        with torch.no_grad():
            q, k, _ = layer.project(x, None)
            gamma = layer.log_decay().double().exp()  # (H,)
            w = gamma[:, None, None] ** lag.clamp(min=0) * (lag >= 0)  # (H, L, L)
            num = torch.einsum("bmhd,bnhd->bhmn", phi(q), phi(k)) * w
            expected = num if attention == "linear" else num / num.sum(-1, keepdim=True)
            torch.testing.assert_close(layer.attention_weights(x), expected, rtol=1e-12, atol=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
def test_exact_weights_are_the_softmax_the_kernel_stands_for(causal):
    """softmax(q̂·k̂/√R + λ|m − n|) for FAVOR+ with a fixed decay and SPE; a softmax layer's own."""
    layer = _layer("performer", "sinespe", decay="fixed", causal=causal, dtype=torch.float64)
    x, code = _inputs(torch.float64), _code(layer, torch.float64)
    with torch.no_grad():
        q, k, _ = layer.project(x, code)
        lam = layer.log_decay().double()
        exact = layer.attention_weights(x, code, exact=True)
        estimate = layer.attention_weights(x, code)
    lag = (torch.arange(L)[:, None] - torch.arange(L)[None, :]).double()
    logits = torch.einsum("bmhr,bnhr->bhmn", q, k) / math.sqrt(R) + lam[:, None, None] * lag.abs()
    if causal:
        logits = logits.masked_fill(lag < 0, -math.inf)
    torch.testing.assert_close(exact, logits.softmax(-1), rtol=0, atol=1e-12)
    assert (exact - estimate).abs().max() > 1e-3  # 8 random features estimate it, with error
    soft = _layer("softmax", "alibi")
    with torch.no_grad():
        torch.testing.assert_close(soft.attention_weights(_inputs(), exact=True), soft.attention_weights(_inputs()))


def test_exact_weights_of_a_gated_softmax_stand_in_for_the_gated_kernel():
    """A gate on a linear kernel is FoX's term Σ_{n<t≤m} G_t with exact=True (the gates between
    m and n either way in an encoder)."""
    for causal in (True, False):
        layer = _layer("linear-elu", decay="gated", causal=causal, dtype=torch.float64)
        x = _inputs(torch.float64)
        with torch.no_grad():
            q, k, _ = layer.project(x, None)
            f = layer.log_decay(x).cumsum(1).transpose(1, 2)  # (B, H, L) running sums of the gates
            exact = layer.attention_weights(x, exact=True)
        logits = torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(D) - (f[..., :, None] - f[..., None, :]).abs()
        if causal:
            logits = logits.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -math.inf)
        torch.testing.assert_close(exact, logits.softmax(-1), rtol=0, atol=1e-12)


def test_attention_weights_refusals():
    x = _inputs()
    with pytest.raises(ValueError, match="rotary encoding transforms the features"):
        _layer("linear-elu", "rope").attention_weights(x, exact=True)
    with pytest.raises(ValueError, match="gated-channel"):
        _layer("linear-relu", decay="gated-channel").attention_weights(x, exact=True)
    with pytest.raises(ValueError, match="takes no positions"):
        _layer("softmax", "alibi").attention_weights(x, positions=torch.arange(L))
    with pytest.raises(ValueError, match="key_padding_mask needs a non-causal layer"):
        _layer("performer").attention_weights(x, key_padding_mask=torch.zeros(B, L, dtype=torch.bool))
    with pytest.raises(ValueError, match="pass the code"):
        _layer("performer", "sinespe").attention_weights(x)


# --- R, the number of realisations of SPE codes -------------------------------------------------

def _spe_layer(attention, num_realizations=None, **kw):
    torch.manual_seed(0)
    return MultiHeadAttention(C, H, attention=attention, positional=SPEFilter(H, D),
                              num_realizations=num_realizations, num_features=8, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("attention", KERNELS)
def test_r_is_taken_from_the_code(attention):
    layer = _spe_layer(attention)
    x, code = _inputs(), _code(layer)
    with torch.no_grad():
        y = layer(x, code)
    assert layer.num_realizations == layer.kernel_dim == R
    if attention == "performer":  # its projection drawn at the first code, then kept
        assert layer.projection.shape == (H, 8, R)
        with torch.no_grad():
            torch.testing.assert_close(layer(x, code), y, rtol=0, atol=0)
    assert layer.feature_sizes() == ((8, 8) if attention == "performer" else (R, R))


@pytest.mark.slow
def test_a_layer_awaiting_its_code_loads_a_saved_projection():
    trained = _spe_layer("performer", num_realizations=R)
    fresh = _spe_layer("performer")
    assert fresh.projection is None and "projection" not in fresh.state_dict()
    fresh.load_state_dict(trained.state_dict())
    x, code = _inputs(), _code(trained)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x, code), trained(x, code), rtol=0, atol=0)


def test_a_given_r_is_checked_against_the_codes():
    channel = _spe_layer("linear-elu", num_realizations=R + 2, decay="gated-channel")
    with pytest.raises(ValueError, match=rf"num_realizations {R} .*num_realizations {R + 2}"):
        channel(_inputs(), _code(channel))
    agreeing = _spe_layer("linear-elu", num_realizations=R, decay="gated-channel")
    with torch.no_grad():
        assert torch.isfinite(agreeing(_inputs(), _code(agreeing))).all()


def test_r_argument_refusals():
    with pytest.raises(ValueError, match=r"num_realizations \(8\) .*SPE"):
        MultiHeadAttention(C, H, attention="performer", num_realizations=8)
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="num_realizations must be a positive int"):
            _spe_layer("performer", num_realizations=bad)
    with pytest.raises(ValueError, match="gated-channel' with SPE .*pass num_realizations"):
        _spe_layer("linear-elu", decay="gated-channel")
    with pytest.raises(ValueError, match="first SPE code"):
        _spe_layer("performer").features(torch.zeros(1, 1, H, R), torch.zeros(1, 1, H, R), None)
    with pytest.raises(ValueError, match="first code"):
        _spe_layer("linear-elu").feature_sizes()
