"""Each decay reaches the layer through one protocol (:mod:`spe.attention.decays`): a model's
logits, in parallel and step by step, are those recorded before the decay became an object (float64,
one thread, fixed seeds).

The record was first SHA-256 digests of the logits' bytes, which held on the processors they were
made on but not across vendors: Intel's and AMD's AVX-512 machines round float64's last bits
differently even with ATen and MKL capped to AVX2. It is now three float64 fingerprints of the same
logits (a fixed random weighting of the parallel and of the step-by-step logits, and their absolute
sum), taken from code that still gave those digests, compared within a tolerance that float64
rounding cannot reach and any change of a formula exceeds."""

import pytest
import torch

from spe.attention.decays import DECAYS
from spe.attention.kernels import decay_form
from spe.attention.layer import MultiHeadAttention
from spe.models import ModelConfig
from spe.models.decoder_lm import DecoderLM
from spe.ops.decay import DECAY_MODES

# (decay, attention, positional) -> (sum(W * parallel logits), sum(W * step logits), sum|parallel logits|)
RECORDED = {
    ("none", "linear-elu", "rope"): (1.8278913066936127, 1.827891306693613, 39.29573992657396),
    ("fixed", "linear-elu", "rope"): (1.8195696208504142, 1.8195696208504146, 39.30440222062006),
    ("learned", "performer", "sinespe"): (3.1732615890223372, 3.1732615890223377, 35.161321004429425),
    ("gated", "softmax", "none"): (1.8075335758959101, 1.8075335758959092, 39.38714030705124),
    ("gated", "linear-elu", "sinespe"): (2.4392714472180637, 2.439271447218064, 37.1146105827826),
    ("gated-channel", "linear-elu", "rope"): (4.6119857477316435, 4.611985747731645, 40.020147391596396),
    ("gated-channel", "linear-elu", "sinespe"): (2.4216704769271433, 2.4216704769271438, 40.01228116942052),
}

# Each fingerprint sums 540 products of logits of magnitude ~1 with weights ~N(0, 1): float64 rounding,
# whatever the order of its sums, moves it by about 540 * 2^-52 * 10 ~ 1e-12 (a logit differs between
# machines by ~1e-16, 1e-16 seen between parallel and step); one gate weight moved by 1e-6 already
# moves the fingerprints by 6e-10 to 3e-9 (the test below), a changed formula by far more.
TOLERANCE = 1e-10


def _fingerprint(case: tuple[str, str, str], edit=None) -> tuple[float, float, float]:
    """:data:`RECORDED`'s three numbers for a small float64 model, one thread (``edit(model)`` first
    where given)."""
    decay, attention, positional = case
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        extra = {"num_realizations": 8} if positional == "sinespe" else {}
        config = ModelConfig(vocab_size=30, d_model=16, num_heads=2, num_layers=2, d_ff=32, dropout=0.0,
                             chunk_size=4, decay=decay, attention=attention, positional=positional, **extra)
        model = DecoderLM(config).double().eval()
        if edit is not None:
            edit(model)
        tokens = torch.randint(0, 30, (2, 9), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            full = model(tokens)
            state, steps = None, []
            for t in range(tokens.shape[1]):
                out, state = model.step(tokens[:, t], state)
                steps.append(out)
    finally:
        torch.set_num_threads(threads)
    weights = torch.randn(full.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    stepped = torch.stack(steps, 1)
    return (full * weights).sum().item(), (stepped * weights).sum().item(), full.abs().sum().item()


@pytest.mark.parametrize("case", list(RECORDED), ids="-".join)
def test_logits_per_decay_are_the_recorded_ones(case):
    assert _fingerprint(case) == pytest.approx(RECORDED[case], rel=0, abs=TOLERANCE)


def test_the_fingerprints_see_a_change_far_smaller_than_a_formula_change():
    """The tolerance is no blindfold: every case has its own numbers, and one weight of the gate's
    projection moved by 1e-6 (far less than a dropped root or flipped sign) moves them past it."""
    assert len({_fingerprint(c) for c in RECORDED}) == len(RECORDED)
    case = ("gated", "softmax", "none")

    def nudge(model):
        with torch.no_grad():
            dict(model.named_parameters())["blocks.0.attn.decay_gate.weight"].view(-1)[0] += 1e-6

    moved = _fingerprint(case, nudge)
    assert max(abs(a - b) for a, b in zip(moved, RECORDED[case])) > 10 * TOLERANCE


@pytest.mark.parametrize("name", DECAY_MODES)
def test_each_decay_hands_the_kernel_the_form_it_declares(name):
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, attention="linear-elu", decay=name)
    assert layer.decay_kind is DECAYS[name]
    x = torch.randn(2, 5, 16)
    assert decay_form(layer.log_decay(x)) == DECAYS[name].form
    if DECAYS[name].from_input:
        with pytest.raises(ValueError, match=f"{name}.*pass x"):
            layer.log_decay()
        padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
        assert (layer.log_decay(x, padding)[1, 3:] == 0).all()  # padding keeps the state
