"""The SPE oracle: exactly what SPE + softmax estimates, with SPE's parameters and checkpoints."""

import copy
import math

import pytest
import torch

from spe.encodings import ConvSPE, SineSPE, positional_names, positional_spec
from spe.encodings.oracle import ExactSPEScores, exact_spe_attention_reference
from spe.models import ClassifierConfig, DecoderLM, EncoderClassifier, ModelConfig

EXACT = {"sinespe-exact": "sinespe", "convspe-exact": "convspe"}
SMALL = dict(vocab_size=12, d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=0.0, num_sines=3,
             kernel_size=5, frequency_init="spread", gated=True, gate_init=-1.0, num_classes=3)


def _pair(spe: str, *, seed=0, **kw):
    """An SPE + softmax classifier and the oracle built from the same seed."""
    models = []
    for name in (spe, spe + "-exact"):
        torch.manual_seed(seed)
        models.append(EncoderClassifier(ClassifierConfig(**{**SMALL, **kw}, positional=name,
                                                         attention="softmax")).eval())
    return models


def test_registered_as_score_encodings_for_softmax_only():
    assert set(EXACT) <= set(positional_names(acts_on="scores"))
    for name in EXACT:
        spec = positional_spec(name)
        assert not spec.stochastic and spec.source == "Liutkus et al. 2021, eq. (8), (16)–(17), exact expectation"
        with pytest.raises(ValueError, match="attention scores"):
            ClassifierConfig(**SMALL, positional=name, attention="performer")


@pytest.mark.parametrize("spe", EXACT.values())
@pytest.mark.parametrize("shared", [True, False])
def test_same_parameters_same_keys_same_initial_values_and_checkpoints_load_both_ways(spe, shared):
    model, oracle = _pair(spe, share_across_layers=shared)
    a, b = model.state_dict(), oracle.state_dict()
    assert list(a) == list(b) and "blocks.1.attn.spe_filter.gate_logits" in b
    assert all(torch.equal(a[k], b[k]) for k in a)
    with torch.no_grad():
        model.blocks[1].attn.spe_filter.gate_logits.fill_(0.7)
        model.layer_encoding(1).state_dict()[next(iter(model.layer_encoding(1).state_dict()))].add_(0.1)
    oracle.load_state_dict(model.state_dict())  # strict: no missing or unexpected key
    assert torch.equal(oracle.blocks[1].attn.score_encoding.gate_logits, model.blocks[1].attn.spe_filter.gate_logits)
    assert oracle.blocks[1].attn.score_encoding.source is oracle.layer_encoding(1)
    model.load_state_dict(oracle.state_dict())
    # named_parameters follow the modules: the oracle's gate sits in its score term
    assert "blocks.0.attn.score_encoding.gate_logits" in dict(oracle.named_parameters())


def _float64_layer(spe: str, causal: bool, gated: bool):
    torch.manual_seed(3)
    source = (SineSPE(2, 4, num_sines=3, frequency_init="spread") if spe == "sinespe"
              else ConvSPE(2, 4, kernel_size=5, causal=causal)).double()
    with torch.no_grad():  # away from the initial values (zero phases, symmetric filters)
        for p in source.parameters():
            p.add_(0.3 * torch.randn(p.shape, dtype=p.dtype))
    layer = ExactSPEScores(2, 4, gated=gated, gate_init=-0.5, causal=causal).double()
    if gated:
        with torch.no_grad():
            layer.gate_logits.add_(torch.randn(2, 4, dtype=torch.float64))
    layer.bind(source)
    return layer, source


@pytest.mark.parametrize("spe", ["sinespe", "convspe"])
@pytest.mark.parametrize("causal,gated,masked", [(True, True, False), (False, True, True), (False, False, False)])
def test_matches_the_float64_reference_forward_and_backward(spe, causal, gated, masked):
    layer, source = _float64_layer(spe, causal, gated)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 9, 2, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.arange(9)[None] >= torch.tensor([9, 5, 7])[:, None] if masked else None
    params = [q, k, v, *source.parameters(), *layer.parameters()]
    weights = torch.randn(3, 9, 2, 4, generator=g, dtype=torch.float64)

    out = layer.attend(q, k, v, key_padding_mask=mask)
    ref, _ = exact_spe_attention_reference(q, k, v, source.kernel, gate=layer.gate, causal=causal,
                                           key_padding_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    got = torch.autograd.grad((out * weights).sum(), params)
    want = torch.autograd.grad((ref * weights).sum(), params)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    assert all(a.abs().sum() > 0 for a in got[3:])  # frequencies/phases/gains or filters, and gates


class _DecayKernel(torch.nn.Module):
    """A kernel that is neither sine nor conv (exp(−a·|lag|) per head and feature): the gathered path."""

    num_heads, head_dim = 2, 4

    def __init__(self):
        super().__init__()
        self.rates = torch.nn.Parameter(torch.rand(2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5)))

    def kernel(self, lags):
        return torch.exp(-self.rates[..., None] * lags.abs().to(self.rates))


@pytest.mark.parametrize("spe", ["convspe", "decay"])
@pytest.mark.parametrize("causal,gated", [(True, True), (False, True), (False, False)])
@pytest.mark.parametrize("num_queries,num_keys,query_offset", [(3, 3, 0), (9, 9, 0), (1, 12, 11), (4, 12, 8),
                                                               (2, 20, 5), (6, 4, 0)])
def test_banded_and_gathered_kernels_match_the_reference_at_any_length_and_offset(
        spe, causal, gated, num_queries, num_keys, query_offset):
    # convSPE's band (2P − 1 = 9 diagonals) shorter and longer than the sequence, decoding offsets,
    # more queries than keys; the decay kernel takes the gathered path over distinct lags.
    if spe == "convspe":
        layer, source = _float64_layer(spe, causal, gated)
    else:
        source = _DecayKernel()
        layer = ExactSPEScores(2, 4, gated=gated, gate_init=0.4, causal=causal).double()
        layer.bind(source)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, num_queries, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, num_keys, 2, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    params = [q, k, v, *source.parameters(), *layer.parameters()]
    out = layer.attend(q, k, v, query_offset=query_offset)
    ref, _ = exact_spe_attention_reference(q, k, v, source.kernel, gate=layer.gate, causal=causal,
                                           query_offset=query_offset)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(layer.scores(q, k, query_offset=query_offset) * 2,  # √D = 2
                               torch.einsum("bmhd,bnhd,hdmn->bhmn", q, k, layer.kernel(
                                   (torch.arange(num_queries)[:, None] + query_offset - torch.arange(num_keys)).flatten()
                               ).reshape(2, 4, num_queries, num_keys)), atol=1e-12, rtol=1e-10)
    weights = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((out * weights).sum(), params)
    want = torch.autograd.grad((ref * weights).sum(), params)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def _isserlis_variance(oracle, spe_module, gate, q, k):
    """Var of one realisation's score term U·V/√D (U = Σ q_d Q̃_d, V = Σ k_d K̃_d, jointly Gaussian):
    (E[U²] E[V²] + E[UV]²) / D per (b, h, m, n), with E[Q̃_d²] = (1 − δ) C^QQ_d(0) + δ."""
    if isinstance(spe_module, SineSPE):
        cqq = ckk = (spe_module.gains ** 2).sum(-1) / (2 * spe_module.num_sines)  # (H, D)
    else:
        cqq, ckk = (spe_module.filters_q ** 2).sum(-1), (spe_module.filters_k ** 2).sum(-1)
    cqq, ckk = (1 - gate) * cqq + gate, (1 - gate) * ckk + gate
    euu = torch.einsum("bmhd,hd->bhm", q ** 2, cqq)
    evv = torch.einsum("bnhd,hd->bhn", k ** 2, ckk)
    euv = oracle.scores(q, k) * math.sqrt(q.shape[-1])  # Σ_d q_d k_d P̃_d
    return (euu[..., :, None] * evv[..., None, :] + euv ** 2) / q.shape[-1]


def _kernel_table(module, length):
    """(H, D, L, L) kernel P_d(m − n) of an SPE module (or P̃_d of a score term)."""
    lags = torch.arange(length)[:, None] - torch.arange(length)[None, :]
    return module.kernel(lags.flatten()).reshape(module.num_heads, module.head_dim, length, length)


def _layer0(model, tokens):
    """Queries and keys of layer 0 (before any positional encoding) of a model in eval mode."""
    attn = model.blocks[0].attn
    x = model.blocks[0].norm1(model.embed_tokens(tokens, torch.arange(tokens.shape[1])))
    q, k, _ = attn.qkv(x).view(*x.shape[:2], 3, attn.num_heads, attn.head_dim).unbind(2)
    return x, q, k


@pytest.mark.slow
@pytest.mark.parametrize("spe", EXACT.values())
def test_spe_scores_are_unbiased_with_the_predicted_variance_and_attention_converges_as_one_over_sqrt_r(spe):
    torch.set_num_threads(1)
    model, oracle = _pair(spe)
    with torch.no_grad():  # O(1) scores (GPT-2's 0.02 init gives nearly uniform attention)
        model.blocks[0].attn.qkv.weight.normal_(0, 16 ** -0.5, generator=torch.Generator().manual_seed(1))
        model.encoding.state_dict()[next(iter(model.encoding.state_dict()))].add_(0.2)
    oracle.load_state_dict(model.state_dict())
    tokens = torch.randint(2, 12, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        x, q, k = _layer0(oracle, tokens)
        term = oracle.blocks[0].attn.score_encoding
        exact_scores, exact_weights = term.scores(q, k), term.weights(q, k)
        sigma = _isserlis_variance(term, oracle.encoding, term.gate, q, k).sqrt()
        # what an oracle that forgot the gate would say: P instead of P̃
        ungated = torch.einsum("bmhd,bnhd,hdmn->bhmn", q, k, _kernel_table(term.source, 8)) / math.sqrt(q.shape[-1])
        draws, errors = 16, {}
        for r in (64, 256, 1024):
            z2, err2, deviations = [], [], []
            for t in range(draws):
                code = model.draw_codes(8, generator=torch.Generator().manual_seed(100 * r + t),
                                        num_realizations=r)[0]
                qh, kh, _ = model.blocks[0].attn.project(x, code)  # (B, L, H, R)
                scores = torch.einsum("bmhr,bnhr->bhmn", qh, kh) / math.sqrt(r)
                deviations.append(scores)
                z2.append(((scores - exact_scores) / (sigma / math.sqrt(r))) ** 2)
                err2.append(((scores.softmax(-1) - exact_weights) ** 2).sum())
            z2 = torch.stack(z2)
            # one Gaussian entry beyond 5σ has probability 6e-7 (16·128 entries per R: 1e-3 for all)
            assert z2.max() < 25, (r, z2.max())
            # the variance Isserlis predicts: mean z² = 1 over 2,048 entries (16 independent codes)
            assert 0.5 < z2.mean() < 2.0, (r, z2.mean())
            # unbiased: the mean of the 16 draws (16·R realisations) is within 5 of its σ of the oracle
            mean = torch.stack(deviations).mean(0)
            pooled_sigma = sigma / math.sqrt(draws * r)
            assert ((mean - exact_scores) / pooled_sigma).abs().max() < 5, r
            errors[r] = (torch.stack(err2).mean() / exact_weights.numel()).sqrt().item()
        # the check has power: the ungated kernel is rejected (measured: 15σ sine, 22σ conv)
        assert ((mean - ungated) / pooled_sigma).abs().max() > 5
    # attention weights: RMS error · √R constant to first order (the O(1/R) bias is second order)
    scaled = {r: e * math.sqrt(r) for r, e in errors.items()}
    assert 0.5 < scaled[64] / scaled[1024] < 2.0, errors
    assert errors[1024] < errors[256] < errors[64], errors


@pytest.mark.parametrize("exact", EXACT)
@pytest.mark.parametrize("shared", [True, False])
def test_recurrent_steps_equal_the_parallel_pass(exact, shared):
    torch.manual_seed(0)
    config = ModelConfig(**{k: v for k, v in SMALL.items() if k != "num_classes"}, positional=exact,
                         attention="softmax", share_across_layers=shared)
    model = DecoderLM(config).eval()
    tokens = torch.randint(0, 12, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        parallel, state, steps = model(tokens), None, []
        for t in range(7):
            logits, state = model.step(tokens[:, t], state)
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1).reshape(parallel.shape), parallel, atol=1e-5, rtol=1e-5)


def test_causal_oracle_ignores_the_future_and_draws_nothing():
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(**{k: v for k, v in SMALL.items() if k != "num_classes"},
                                  positional="sinespe-exact", attention="softmax")).eval()
    tokens = torch.randint(0, 12, (1, 9), generator=torch.Generator().manual_seed(1))
    state = torch.get_rng_state()
    with torch.no_grad():
        full, prefix = model(tokens), model(tokens[:, :5])
    assert torch.equal(torch.get_rng_state(), state) and model.draw_codes(9) == [None, None]
    torch.testing.assert_close(full[:, :5], prefix, atol=1e-5, rtol=1e-5)
    model.train()
    torch.testing.assert_close(model(tokens), full)  # deterministic in training mode too


def test_an_unbound_or_mismatched_score_term_says_so():
    term = ExactSPEScores(2, 4)
    with pytest.raises(RuntimeError, match="not bound"):
        term.attend(*(torch.randn(1, 3, 2, 4) for _ in range(3)))
    with pytest.raises(ValueError, match=r"\(num_heads, head_dim\) = \(2, 4\).*SPE module of \(2, 8\)"):
        term.bind(SineSPE(2, 8))
    with pytest.raises(ValueError, match="kernel"):
        term.bind(torch.nn.Linear(2, 2))
    term.bind(SineSPE(2, 4))
    with pytest.raises(ValueError, match="key_padding_mask must be a"):
        term.attend(*(torch.randn(1, 3, 2, 4) for _ in range(3)), key_padding_mask=torch.zeros(1, 4, dtype=torch.bool))


def test_a_deep_copy_keeps_each_layer_bound_to_its_own_copy():
    _, oracle = _pair("sinespe", share_across_layers=False)
    twin = copy.deepcopy(oracle)
    assert twin.blocks[1].attn.score_encoding.source is twin.layer_encoding(1)
    assert twin.blocks[1].attn.score_encoding.source is not oracle.layer_encoding(1)
