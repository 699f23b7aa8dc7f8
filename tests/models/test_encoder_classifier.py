"""EncoderClassifier: padding never reaches a prediction, the two-tower head, SPE stays relative."""

import itertools

import pytest
import torch

from spe.encodings.conv import ConvSPE
from spe.encodings.filter import SPEFilter
from spe.encodings.sine import SineSPE
from spe.models import ClassifierConfig, EncoderClassifier

# Score encodings (softmax only) take the padding mask through their own attention.
POSITIONALS = ("ape", "ape-learned", "sinespe", "convspe", "rope", "none", "shaw", "music-relative", "alibi",
               "sinespe-exact", "convspe-exact")
ATTENTIONS = ("performer", "linear-relu", "linear-elu", "softmax")


def _config(positional="sinespe", attention="performer", **kw):
    base = dict(vocab_size=12, d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=0.0, positional=positional,
                attention=attention, num_realizations=8, num_sines=2, kernel_size=5, num_features=16, gated=True,
                max_positions=64, num_classes=3)
    return ClassifierConfig(**{**base, **kw})


def _valid(positional, attention):
    try:
        _config(positional, attention)
    except ValueError:
        return False
    return True


PAIRS = [(p, a) for p, a in itertools.product(POSITIONALS, ATTENTIONS) if _valid(p, a)]


@pytest.mark.slow
@pytest.mark.parametrize("positional,attention", PAIRS)
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_padding_and_its_content_never_change_a_prediction(positional, attention, pooling):
    torch.manual_seed(0)
    model = EncoderClassifier(_config(positional, attention, pooling=pooling)).eval()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(2, 12, (3, 9), generator=g)
    lengths = torch.tensor([9, 4, 6])
    tokens[1, 4:] = 0  # the usual padding id
    tokens[2, 6:] = 0
    # 7 more positions of arbitrary content (even CLS and real symbols) beyond every length
    padded = torch.cat([tokens, torch.randint(0, 12, (3, 7), generator=g)], dim=1)
    padded[1, 4:9] = torch.randint(0, 12, (5,), generator=g)
    with torch.no_grad():  # the pooled encodings (unit scale after the final norm), then the logits
        short, long = model.encode(tokens, lengths), model.encode(padded, lengths)
        unmasked = model.encode(padded)  # control: the same tokens read as real change the encoding
        torch.testing.assert_close(model(padded, lengths), model(tokens, lengths), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(long, short, atol=2e-5, rtol=1e-5)
    assert (unmasked - short).abs().max() > 1e-2


def test_the_mask_comes_from_lengths_not_token_ids():
    model = EncoderClassifier(_config("sinespe", "softmax")).eval()
    tokens = torch.tensor([[3, 4, 0, 5, 6]])  # a 0 inside the sequence is content here
    with torch.no_grad():
        whole, cut = model.encode(tokens, torch.tensor([5])), model.encode(tokens, torch.tensor([3]))
    assert (whole - cut).abs().max() > 1e-2


def _head_input(model, *args):
    seen = {}
    handle = model.head.register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0]))
    with torch.no_grad():
        model(*args)
    handle.remove()
    return seen["x"]


@pytest.mark.parametrize("interaction", ["nli", "concat"])
def test_two_tower_head_on_swapped_documents(interaction):
    torch.manual_seed(0)
    model = EncoderClassifier(_config("sinespe", "performer", interaction=interaction, pooling="mean")).eval()
    g = torch.Generator().manual_seed(2)
    a, b = torch.randint(2, 12, (3, 7), generator=g), torch.randint(2, 12, (3, 11), generator=g)
    la, lb = torch.tensor([7, 3, 5]), torch.tensor([11, 10, 2])
    c = model.config.d_model
    ab, ba = _head_input(model, a, la, b, lb), _head_input(model, b, lb, a, la)
    with torch.no_grad():  # each document alone: its embedding ignores the other one in the batch
        u, v = model.encode(a, la), model.encode(b, lb)
    torch.testing.assert_close(ab[:, :c], u, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ab[:, c:2 * c], v, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ba[:, :c], ab[:, c:2 * c])
    torch.testing.assert_close(ba[:, c:2 * c], ab[:, :c])
    if interaction == "nli":  # [u, v, u·v, u − v]: the product is symmetric, the difference flips sign
        assert ab.shape[1] == 4 * c
        torch.testing.assert_close(ab[:, 2 * c:3 * c], u * v, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ba[:, 2 * c:3 * c], ab[:, 2 * c:3 * c])
        torch.testing.assert_close(ba[:, 3 * c:], -ab[:, 3 * c:])
    else:
        assert ab.shape[1] == 2 * c


def test_pairs_are_required_exactly_with_an_interaction():
    single, pair = EncoderClassifier(_config()), EncoderClassifier(_config(interaction="nli"))
    t = torch.randint(2, 12, (2, 5))
    with pytest.raises(ValueError, match="pairs"):
        pair(t)
    with pytest.raises(ValueError, match="no two-tower"):
        single(t, None, t)


def test_convspe_2d_gives_the_cls_token_a_zero_code_row_and_checks_the_grid():
    model = EncoderClassifier(_config("convspe-2d", "performer", grid=(3, 4), kernel_size=3)).eval()
    code = model.draw_codes(13)[0]
    assert code.qbar.shape[0] == 13
    assert code.qbar[0].abs().max() == 0 and code.kbar[0].abs().max() == 0
    assert code.qbar[1:].abs().min() > 0 or code.qbar[1:].abs().max() > 0
    assert model(torch.randint(2, 12, (2, 12))).shape == (2, 3)
    with pytest.raises(ValueError, match="3 × 4 grid"):
        model(torch.randint(2, 12, (2, 10)))


@pytest.mark.parametrize("bad,match", [({"positional": "shaw", "attention": "performer"}, "scores"),
                                       ({"max_distance": 0}, "max_distance"),
                                       ({"pooling": "max"}, "pooling"), ({"interaction": "dot"}, "interaction"),
                                       ({"num_classes": 1}, "num_classes"),
                                       ({"positional": "convspe-2d"}, "2-D grid")])
def test_bad_configurations_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        _config(**bad)


def test_per_layer_codes_differ_and_shared_codes_do_not():
    shared = EncoderClassifier(_config("sinespe", share_across_layers=True)).eval()
    own = EncoderClassifier(_config("sinespe", share_across_layers=False)).eval()
    a, b = shared.draw_codes(6)
    assert a is b
    a, b = own.draw_codes(6)
    assert not torch.equal(a.weights, b.weights)
    assert own.layer_encodings is not None and shared.layer_encodings is None


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sinespe", "convspe", "convspe-centred"])
def test_non_causal_spe_scores_depend_on_the_lag_only(kind):
    # Same content at every position: q̂_m·k̂_n / √R has expectation Σ_d q_d k_d P_d(m − n) / √D
    # (SPE-NOTES, eq. 16-17), whatever m and n are. Mean over N = 300 codes; the tolerance is
    # 5 standard errors of that mean, estimated from the draws themselves.
    torch.manual_seed(0)
    encoding = SineSPE(1, 3, 64, 3) if kind == "sinespe" else ConvSPE(1, 3, 64, 6, causal=kind == "convspe")
    with torch.no_grad():  # an asymmetric kernel, P(2) ≠ P(−2): phases of ~π/2, or Φ^Q ≠ Φ^K
        if kind == "sinespe":
            encoding.phases.fill_(1.5)
        else:
            encoding.filters_q.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(4))
    spe_filter = SPEFilter(1, 3, gated=False)
    q, k = torch.tensor([0.9, -0.5, 0.7]), torch.tensor([0.8, 0.6, -0.4])
    x_q, x_k = q.expand(1, 24, 1, 3), k.expand(1, 24, 1, 3)
    pairs = [(3, 1), (12, 10), (21, 19), (1, 3), (10, 12), (19, 21)]  # lags +2 and −2, both directions
    g = torch.Generator().manual_seed(3)
    draws = []
    with torch.no_grad():
        for _ in range(300):
            qh, kh = spe_filter(x_q, x_k, encoding(24, generator=g))
            draws.append(torch.stack([qh[0, m, 0] @ kh[0, n, 0] for m, n in pairs]) / 64 ** 0.5)
    draws = torch.stack(draws)
    mean, stderr = draws.mean(0), draws.std(0) / 300 ** 0.5
    with torch.no_grad():
        expected = (q * k * encoding.kernel(torch.tensor([2, -2]))[0].T).sum(-1) / 3 ** 0.5  # (2,)
    expected = expected.repeat_interleave(3)
    assert ((mean - expected).abs() < 5 * stderr + 1e-6).all(), (mean, expected, stderr)
    assert (expected[0] - expected[3]).abs() > 5 * stderr.max()  # the two signs of the lag really differ here


def test_classifier_checkpoints_round_trip(tmp_path):
    from spe.checkpoint import load, load_metadata, save

    model = EncoderClassifier(_config("convspe", "linear-relu", interaction="concat")).eval()
    save(model, tmp_path, metadata={"step": 3})
    loaded = load(tmp_path).model
    assert isinstance(loaded, EncoderClassifier) and load_metadata(tmp_path)["model_kind"] == "encoder-classifier"
    t = torch.randint(2, 12, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(loaded(t, None, t.flip(1)), model(t, None, t.flip(1)))
