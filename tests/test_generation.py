"""Nucleus sampling keeps exactly the top-p mass; masks and temperature are honoured."""

import pytest
import torch

from spe.generation import check_sampling, generate, nucleus_filter, sample_next
from spe.models import ModelConfig
from spe.models.decoder_lm import DecoderLM


def test_nucleus_keeps_smallest_set_reaching_p():
    probs = torch.tensor([0.05, 0.5, 0.3, 0.15])
    kept = torch.isfinite(nucleus_filter(probs.log(), 0.8))
    assert kept.tolist() == [False, True, True, False]  # 0.5 + 0.3 reaches 0.8
    kept = torch.isfinite(nucleus_filter(probs.log(), 0.81))
    assert kept.tolist() == [False, True, True, True]
    assert torch.isfinite(nucleus_filter(probs.log(), 1e-6)).sum() == 1
    with pytest.raises(ValueError, match="top_p"):
        nucleus_filter(probs, 0.0)


@pytest.mark.slow
def test_sampling_respects_the_mask_and_frequencies():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    g = torch.Generator().manual_seed(0)
    allowed = torch.tensor([False, True, True])
    draws = [sample_next(logits, top_p=1.0, temperature=1.0, allowed=allowed, generator=g) for _ in range(2000)]
    assert 0 not in draws
    share = draws.count(1) / len(draws)  # renormalised: 0.75, binomial sd ≈ 0.0097
    assert abs(share - 0.75) < 4 * (0.75 * 0.25 / 2000) ** 0.5
    with pytest.raises(ValueError, match="temperature"):
        sample_next(logits, top_p=0.9, temperature=0.0, allowed=None, generator=g)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), float("-inf"), 0.0, -1.0, True, "1"])
def test_generate_refuses_a_temperature_that_is_not_finite_and_positive_before_any_step(temperature):
    model = DecoderLM(ModelConfig(vocab_size=12, d_model=8, num_layers=1, num_heads=2, d_ff=16, num_features=4))
    model.step = None  # any decoding step would fail otherwise: the check comes first
    with pytest.raises(ValueError, match=rf"^temperature .*positive.*got {temperature!r}$"):
        generate(model, [1, 2], 0, temperature=temperature)
    with pytest.raises(ValueError, match=r"^top_p .*\(0, 1\].*got nan$"):
        generate(model, [1, 2], 3, top_p=float("nan"))
    with pytest.raises(ValueError, match=r"^num_tokens .*≥ 0.*got -1$"):
        generate(model, [1, 2], -1)


def test_a_tiny_temperature_is_the_greedy_limit():
    """t → 0: the most likely allowed token, ties shared; 1e-40 and 5e-324 overflow float32 (x / t = inf)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 30, generator=g) * 5
    for row in logits:
        for t in (1e-40, 5e-324):
            assert sample_next(row, top_p=0.9, temperature=t, allowed=None, generator=g) == int(row.argmax())
    allowed = torch.arange(30) % 2 == 1
    for row in logits:
        best = int(torch.where(allowed, row, float("-inf")).argmax())
        assert sample_next(row, top_p=1.0, temperature=1e-40, allowed=allowed, generator=g) == best
    tie = torch.tensor([1.0, 3.0, 2.0, 3.0])
    draws = [sample_next(tie, top_p=1.0, temperature=1e-40, allowed=None, generator=g) for _ in range(200)]
    assert set(draws) == {1, 3}


def test_ordinary_temperatures_draw_exactly_as_before():
    """The float32 path is unchanged: the same draws as softmax(nucleus(logits / t)) for the same generator."""
    logits = torch.randn(20, 30, generator=torch.Generator().manual_seed(1)) * 3
    for t in (0.5, 1.2, 3.0):
        g, h = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
        for row in logits:
            before = int(torch.multinomial(torch.softmax(nucleus_filter(row / t, 0.9), -1), 1, generator=h))
            assert sample_next(row, top_p=0.9, temperature=t, allowed=None, generator=g) == before


def test_check_sampling_names_the_caller_s_flags():
    with pytest.raises(ValueError, match=r"^--temperature .*got inf$"):
        check_sampling(top_p=0.9, temperature=float("inf"), temperature_name="--temperature")
    with pytest.raises(ValueError, match=r"^--top-p .*got 1.5$"):
        check_sampling(top_p=1.5, temperature=1.0, top_p_name="--top-p")


def _token_by_token(model, prompt, num_tokens, seed):
    """What generate did before prompts were prefilled: every prompt token one step."""
    g = torch.Generator().manual_seed(seed)
    state = None
    for token in prompt:
        logits, state = model.step(torch.tensor([token]), state)
    seq = list(prompt)
    for _ in range(num_tokens):
        seq.append(sample_next(logits[0], top_p=0.9, temperature=1.2, allowed=None, generator=g))
        logits, state = model.step(torch.tensor([seq[-1]]), state)
    return seq


@pytest.mark.parametrize("kind", [{"positional": "sinespe", "attention": "performer"},
                                  {"positional": "ape", "attention": "softmax"},
                                  {"positional": "convspe", "attention": "linear-elu"},
                                  {"positional": "sinespe", "attention": "performer", "attention_window": 8}],
                         ids=lambda k: "-".join(str(v) for v in k.values()))
@pytest.mark.slow
def test_a_prompt_is_prefilled_in_one_pass_and_samples_the_same_piece(kind):
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(vocab_size=30, d_model=16, num_layers=2, num_heads=2, d_ff=32, num_features=8,
                                  num_realizations=4, kernel_size=4, dropout=0.0, **kind)).eval()
    prompt = torch.randint(0, 30, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    expected = _token_by_token(model, prompt, 12, seed=3)
    steps, step = [], model.step
    model.step = lambda *args: (steps.append(1), step(*args))[1]
    assert generate(model, prompt, 12, generator=torch.Generator().manual_seed(3)) == expected
    assert len(steps) == 11  # one per new token but the last: none for the prompt
