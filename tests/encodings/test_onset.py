"""sineSPE on the music's onset clock (encodings/onset.py, OnsetSPEFilter): the onsets of REMI
tokens, the kernel in onset time, causality, decoding and the refusals where there are no onsets."""

import math
import re

import pytest
import torch

from spe.encodings import SineSPE
from spe.encodings.onset import (OnsetClock, onset_tokens, remi_onsets, remi_onsets_reference,
                                 tokens_per_beat)
from spe.encodings.sine import OnsetSPEFilter
from spe.models import ClassifierConfig, DecoderLM, ModelConfig

# A small REMI vocabulary as MidiTok 3.1 lays it out: time signatures up to 6 beats, 6 × 8 positions
# (8 per beat), and a few note tokens that carry no time.
NAMES = (["PAD_None", "Bar_None", "TimeSig_4/4", "TimeSig_3/4", "TimeSig_6/8"]
         + [f"Position_{k}" for k in range(48)] + ["Program_0", "Pitch_60", "Velocity_63", "Duration_1.0.8"])
VOCAB = {name: i for i, name in enumerate(NAMES)}
V = len(VOCAB)
SCALE = 1.75


def _ids(names):
    return torch.tensor([[VOCAB[n] for n in names]])


def _random_names(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [NAMES[i] for i in torch.randint(1, V, (n,), generator=g).tolist()]


def test_onsets_of_a_hand_built_sequence():
    names = ["Pitch_60", "Position_4", "Pitch_60", "Bar_None", "TimeSig_3/4", "Position_0", "Pitch_60",
             "Position_8", "Velocity_63", "Bar_None", "TimeSig_6/8", "Position_12", "Bar_None", "Bar_None",
             "TimeSig_4/4", "Position_20", "Bar_None"]
    # beats (quarter notes): a note before any bar sits at 0; Position_4 = half a beat into bar 0 (4/4);
    # the next Bar starts bar 1 at 4, 3/4 from there (Position_8 = one beat in); bar 2 at 4 + 3 = 7, in
    # 6/8 a position is 1/8 of an eighth (Position_12 = 0.75); bar 3 at 7 + 3 = 10, bar 4 at 13 (still
    # 6/8 until its TimeSig), 4/4: Position_20 = 2.5 beats in; the last Bar at 13 + 4 = 17
    expected = [0, 0.5, 0.5, 4, 4, 4, 4, 5, 5, 7, 7, 7.75, 10, 13, 13, 15.5, 17]
    assert remi_onsets(_ids(names), VOCAB)[0].tolist() == expected
    assert remi_onsets_reference(names) == expected
    # the first token's onset is 0: a sequence starting on a position is relative to it
    assert remi_onsets(_ids(["Position_8", "Pitch_60", "Position_16", "Bar_None", "Position_0"]), VOCAB)[0].tolist() \
        == [0, 0, 1, 3, 3]
    assert remi_onsets(_ids(["Bar_None", "Pitch_60", "Bar_None"]), VOCAB).dtype == torch.float64


def test_onsets_equal_the_token_by_token_reference_and_go_on_from_their_state():
    clock = OnsetClock(onset_tokens(VOCAB), V)
    assert clock.resolution == 8
    seqs = [_random_names(64, seed) for seed in range(4)]
    tokens = torch.cat([_ids(s) for s in seqs])
    whole, _ = clock(tokens)
    for row, names in zip(whole, seqs):
        assert row.tolist() == pytest.approx(remi_onsets_reference(names), abs=1e-12)
    for cuts in ([1, 2, 3, 20, 64], [31, 33, 64], [64]):  # chunks (one token: decoding) give the same times
        state, parts, start = None, [], 0
        for end in cuts:
            times, state = clock(tokens[:, start:end], state)
            parts.append(times)
            start = end
        torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=0, atol=0)


def test_a_vocabulary_without_onsets_is_refused_in_one_line():
    with pytest.raises(ValueError, match="needs a REMI vocabulary .* no onsets"):
        onset_tokens({"a": 0, "b": 1, "Position_0": 2})
    with pytest.raises(ValueError, match="Rest tokens"):
        onset_tokens({**VOCAB, "Rest_1.0.8": V})
    with pytest.raises(ValueError, match="outside the vocabulary"):
        OnsetClock(VOCAB, 10)  # Position_5 and on lie beyond


def test_tokens_per_beat_is_the_corpus_tokens_over_its_beats():
    pieces = [_ids(["Bar_None", "Position_0", "Pitch_60", "Bar_None", "Position_0", "Pitch_60"])[0],  # 6 tokens, 4 beats
              _ids(["Bar_None", "TimeSig_3/4", "Position_8", "Pitch_60"])[0],  # 4 tokens, 1 beat
              _ids(["Pitch_60"])[0]]  # no time: not counted
    assert tokens_per_beat(pieces, OnsetClock(VOCAB, V)) == pytest.approx(10 / 5)
    with pytest.raises(ValueError, match="span time"):
        tokens_per_beat(pieces[2:], OnsetClock(VOCAB, V))


def _model(attention="linear", decay="none", seed=0, **extra):
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=V, d_model=16, num_heads=2, num_layers=2, d_ff=32, dropout=0.0,
                         positional="sinespe", attention=attention, decay=decay, num_realizations=8,
                         num_features=8, spe_time="onset", onset_tokens=onset_tokens(VOCAB), onset_scale=SCALE,
                         **extra)
    return DecoderLM(config).eval()


def test_the_model_reads_the_scaled_onsets_of_its_tokens():
    model = _model()
    tokens = torch.cat([_ids(_random_names(20, seed)) for seed in (5, 6)])
    times, _ = model._times(tokens, None)
    torch.testing.assert_close(times, SCALE * remi_onsets(tokens, VOCAB), rtol=0, atol=0)
    x = torch.randn(2, 20, 16)
    context, state = model.blocks[0].attn.positional.prepare(x, times)
    assert state is None and context.shape == (2, 20, 2) and context.dtype == torch.float64
    torch.testing.assert_close(context, times[..., None].expand(-1, -1, 2))
    with pytest.raises(ValueError, match="per-sequence times .* got positions \\(20,\\)"):
        model.blocks[0].attn.positional.prepare(x, torch.arange(20))
    with pytest.raises(ValueError, match="takes no positions"):
        model(tokens, positions=torch.arange(20.0))


@pytest.mark.parametrize("shift", [0.0, 37.25])
def test_monte_carlo_products_converge_to_the_kernel_at_the_onset_lag_whatever_the_origin(shift):
    # E[q̂_m·k̂_n] = Σ_d q_d k_d P_d(τ_m − τ_n): the kernel reads the onset lag only, so times shifted by
    # a constant have the same target (per realisation, (DR)^{1/2} q̂_mr k̂_nr has that mean)
    torch.manual_seed(0)
    h, d = 2, 3
    names = ["Bar_None", "Position_0", "Pitch_60", "Position_12", "Pitch_60", "Bar_None", "Position_4", "Pitch_60"]
    tokens = _ids(names)
    times = SCALE * remi_onsets(tokens, VOCAB) + shift  # (1, 8)
    n = tokens.shape[1]
    lag = float(times[0, -1] - times[0, 1])  # 1.75 · 4.5 beats over 6 tokens: far from the index lag
    assert abs(lag - (n - 2)) > 1
    enc = SineSPE(h, d, num_sines=4, frequency_init="spread")
    with torch.no_grad():
        enc.phases.normal_()
    filt = OnsetSPEFilter(h, d)
    q, k = torch.randn(1, n, h, d), torch.randn(1, n, h, d)
    with torch.no_grad():
        context, _ = filt.prepare(torch.zeros(1, n, 4), times)
        kernel = enc.kernel(torch.tensor([lag]))[:, :, 0]  # (H, D)
        target = (q[0, -1] * k[0, 1] * kernel).sum(-1).double()
        for r, seed in ((256, 1), (32768, 2)):
            code = enc(n, num_realizations=r, generator=torch.Generator().manual_seed(seed))
            qh, kh = filt.encode_queries_keys(q, k, code=code, context=context)
            samples = (qh[0, -1] * kh[0, 1]).double() * math.sqrt(d * r)  # (H, R)
            err = (samples.mean(-1) - target).abs()
            # a Gaussian mean is within 4.5 standard errors with probability 1 − 7e-6 (fixed seeds)
            assert (err <= 4.5 * samples.std(-1) / math.sqrt(r)).all(), (r, err)


@pytest.mark.parametrize("attention,decay", [("linear", "gated"), ("performer", "none"), ("softmax", "none"),
                                             ("linear-elu", "gated-channel")])
def test_the_onset_clock_is_causal_and_decodes_step_by_step_as_the_parallel_forward(attention, decay):
    model = _model(attention, decay)
    tokens = torch.cat([_ids(_random_names(14, seed)) for seed in (1, 2)])
    logits = model(tokens)
    changed = tokens.clone()
    changed[:, 8:] = torch.cat([_ids(_random_names(6, seed)) for seed in (3, 4)])
    other = model(changed)
    torch.testing.assert_close(other[:, :8], logits[:, :8], rtol=0, atol=1e-6)  # causal, the clock included
    assert (other[:, 8:] - logits[:, 8:]).abs().max() > 1e-4
    prefix, state = model.prefill(tokens[:, :5])
    steps = [prefix]
    for t in range(5, 14):  # the decoding state carries the running bar and position
        out, state = model.step(tokens[:, t], state)
        steps.append(out[:, None])
    torch.testing.assert_close(torch.cat(steps, 1), logits, rtol=1e-5, atol=1e-5)
    fresh, state = None, None
    for t in range(14):  # from the very first token too
        fresh, state = model.step(tokens[:, t], state)
    torch.testing.assert_close(fresh, logits[:, -1], rtol=1e-5, atol=1e-5)
    if attention != "softmax":  # a state passed on (state passing, saved and read back) carries the clock
        from spe.lab.music.state_passing import state_from_dict, state_to_dict

        head, carried = model(tokens[:, :5], return_state=True)
        tail, _ = model(tokens[:, 5:], state=state_from_dict(state_to_dict(carried)), return_state=True)
        torch.testing.assert_close(torch.cat([head, tail], 1), logits, rtol=1e-5, atol=1e-5)


def test_the_onset_clock_differs_from_the_index_and_is_kept_in_checkpoints(tmp_path):
    from spe.checkpoint import load, save

    model = _model("performer")
    index = DecoderLM(ModelConfig(**{**model.config.to_dict(), "spe_time": "index"})).eval()
    assert not index.load_state_dict(model.state_dict()).missing_keys  # no parameter of its own
    tokens = _ids(_random_names(16, 7))
    assert (model(tokens) - index(tokens)).abs().max() > 1e-4
    loaded = load(save(model, tmp_path / "onset")).model
    assert loaded.config.onset_scale == SCALE and loaded.config.onset_tokens == onset_tokens(VOCAB)
    torch.testing.assert_close(loaded(tokens), model(tokens))


def test_where_there_are_no_onsets_the_onset_clock_is_refused():
    with pytest.raises(ValueError, match="spe_time must be one of index, learned, onset, got 'clock'"):
        ModelConfig(vocab_size=5, spe_time="clock")
    with pytest.raises(ValueError, match="onset_tokens and onset_scale"):  # a model without a REMI vocabulary
        DecoderLM(ModelConfig(vocab_size=5, d_model=16, num_heads=2, spe_time="onset"))
    with pytest.raises(ValueError, match="encoder, which has none"):  # LRA's classifiers
        ClassifierConfig(vocab_size=5, num_classes=2, spe_time="onset")
    for scale in (float("nan"), 1e308, -1.0):  # 1e308 turned every time into inf, every score into NaN
        with pytest.raises(ValueError, match=r"onset_scale must be a number in \[0, 1e\+06\] .*got "
                                             + re.escape(repr(scale))):
            ModelConfig(vocab_size=5, onset_scale=scale)
    from spe.lab.synth.config import preset_config

    with pytest.raises(ValueError, match="spe synth's tasks have none"):
        preset_config("flip-flop", model={"positional": "sinespe", "spe_time": "onset"})


def test_the_attention_read_offline_is_the_onset_clocks():
    from spe.lab.metrics.capture import attention_matrices, layer_queries_keys

    model = _model("softmax")
    tokens = _ids(_random_names(12, 8))
    times, _ = model._times(tokens, None)
    attn, seen = model.blocks[1].attn, {}
    handle = attn.register_forward_pre_hook(lambda m, a, kw: seen.update(x=a[0], code=a[1]), with_kwargs=True)
    with torch.no_grad():
        model(tokens)
    handle.remove()
    expected = attn.attention_weights(seen["x"], seen["code"], times=times, dtype=torch.float64)[0]
    torch.testing.assert_close(attention_matrices(model, tokens[0], layer=1), expected)
    q, k = layer_queries_keys(model, tokens, layer=1)
    torch.testing.assert_close(q, attn.project(seen["x"], seen["code"], times=times)[0])
    assert (q - attn.project(seen["x"], seen["code"], times=times * 1.5)[0]).abs().max() > 1e-4
