"""sineSPE and RoPE in learned time (encodings/clock.py): the clock, the codes it reads, the model's
causality, decoding and checkpoints."""

import math

import pytest
import torch

from spe.attention import MultiHeadAttention
from spe.encodings import SineSPE, SPEFilter
from spe.encodings.clock import LearnedClock, inverse_softplus
from spe.encodings.rope import LearnedTimeRotary, RotaryEncoding, rotate
from spe.encodings.sine import LearnedTimeSPEFilter
from spe.ops.sine.apply import apply_sine_code_timed, apply_sine_code_timed_pair
from spe.ops.sine.naive import apply_sine_code_timed_reference, clock_reference
from spe.ops.sine import timed as timed_module
from spe.ops.sine.costs import BLOCK_ELEMENTS
from spe.ops.sine.timed import timed_trig
from spe.models import DecoderLM, ModelConfig

LEARNED = {"sinespe": {"spe_time": "learned"}, "rope": {"rope_time": "learned"}}


def _wind(module: torch.nn.Module, seed: int = 0, scale: float = 0.5) -> None:
    """Random clock parameters (steps of very different sizes), so that τ is far from the index."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if ".clock." in f".{name}":
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def _model(positional, attention="linear", decay="none", *, learned=True, seed=0, **extra):
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=13, d_model=16, num_heads=2, num_layers=2, d_ff=32, dropout=0.0,
                         positional=positional, attention=attention, decay=decay, num_realizations=8,
                         num_features=8, **(LEARNED[positional] if learned else {}), **extra)
    return DecoderLM(config).eval()


def test_the_clock_is_the_float64_sum_of_softplus_steps_from_zero_and_goes_on_from_its_state():
    torch.manual_seed(0)
    clock = LearnedClock(8, 3)
    with torch.no_grad():
        clock.weight.normal_()
        clock.bias.normal_()
    x = torch.randn(2, 7, 8)
    times, last = clock(x)
    assert times.dtype == torch.float64 and times.shape == (2, 7, 3)
    torch.testing.assert_close(times, clock_reference(x, clock.weight, clock.bias), rtol=1e-6, atol=1e-6)
    assert torch.equal(times[:, 0], torch.zeros(2, 3)) and torch.equal(last, times[:, -1])
    head = clock(x[:, :3])
    tail = clock(x[:, 3:], head[1])
    torch.testing.assert_close(torch.cat([head[0], tail[0]], 1), times)  # going on from the state = one pass
    # the steps are softplus(wᵀx + b) ≥ 0: time never runs back
    assert (times.diff(dim=1) >= 0).all()
    delta = torch.nn.functional.softplus(x.double() @ clock.weight.double().T + clock.bias.double())
    torch.testing.assert_close(times[:, 1:] - times[:, :1], delta[:, 1:].cumsum(1), rtol=1e-6, atol=1e-6)


def test_the_clock_starts_as_the_index_and_padding_takes_no_step():
    clock = LearnedClock(4, 2)
    assert math.isclose(torch.nn.functional.softplus(torch.tensor(inverse_softplus(1.0), dtype=torch.float64)).item(),
                        1.0, rel_tol=1e-12)
    x = torch.randn(3, 50, 4)
    times, _ = clock(x)
    # b = softplus⁻¹(1) rounded to float32: Δ = 1 to float32 rounding, so τ_m = m to ~1e-7 relative
    torch.testing.assert_close(times, torch.arange(50.0, dtype=torch.float64)[None, :, None].expand(3, 50, 2),
                               rtol=2e-7, atol=1e-6)
    mask = torch.zeros(3, 50, dtype=torch.bool)
    mask[:, 30:] = True
    padded, _ = clock(x, key_padding_mask=mask)
    assert torch.equal(padded[:, :30], times[:, :30]) and (padded[:, 30:] == padded[:, 29:30]).all()
    with pytest.raises(ValueError, match=r"state must be \(batch, num_heads\) = \(3, 2\), got \(3,\)"):
        clock(x, torch.zeros(3))


def _timed_inputs(dtype=torch.float32, gated=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, n, h, d, k, r = 2, 5, 2, 3, 4, 6
    x = torch.randn(b, n, h, d, generator=g)
    freqs = 0.5 * torch.rand(h, d, k, generator=g)
    phases = torch.randn(h, d, k, generator=g)
    times = (torch.rand(b, n, h, generator=g, dtype=torch.float64) * 3).cumsum(1) + 1000.0
    weights = torch.randn(h, d, 2 * k, r, generator=g)
    gate = torch.rand(h, d, generator=g) if gated else None
    noise = torch.randn(h, d, r, generator=g)
    out = [x, freqs, phases, times, weights, gate, noise]
    return [t if t is None else t.to(dtype).requires_grad_() if t is not times else t.requires_grad_() for t in out]


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("side", ["queries", "keys"])
def test_the_timed_code_equals_its_float64_reference_forward_and_backward(gated, side):
    fast = _timed_inputs(gated=gated)
    slow = [t if t is None else t.detach().double().requires_grad_() for t in fast]
    if side == "keys":
        fast[2] = slow[2] = None
    y = apply_sine_code_timed(*fast)
    ref = apply_sine_code_timed_reference(*slow)
    assert y.dtype == torch.float32
    # float32 products of D·2K = 24 terms of size ~1 and cos/sin of exactly reduced phases: ~1e-6
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    upstream = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (y.double() * upstream).sum().backward()
    (ref * upstream).sum().backward()
    for name, a, b in zip(("x", "frequencies", "phases", "times", "weights", "gate"), fast, slow):
        if a is not None:
            # d/df carries τ ≈ 1,000: float32 gradients of size ~1e3 · 1e-6
            torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-4, atol=1e-3 if name == "frequencies" else 1e-5,
                                       msg=name)


@pytest.mark.parametrize("offset", [0.0, 1.0e4, 1.0e6])
def test_timed_trig_keeps_the_phase_exact_at_large_times(offset):
    # a float32 product 2π f τ would lose ~0.4 rad at τ = 1e6; the float64 reduction keeps the
    # phase to ~2π·6e-8 whatever τ
    g = torch.Generator().manual_seed(3)
    freqs = 0.5 * torch.rand(2, 3, 4, generator=g)
    times = (torch.rand(2, 14, generator=g, dtype=torch.float64) * 3).cumsum(1) + offset  # (H, N)
    cos, sin = timed_trig(freqs, times, torch.float32)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (2, 14, 4, 3)  # (H, N, K, D)
    angle = 2 * math.pi * times[:, :, None, None] * freqs.double().transpose(1, 2)[:, None]
    torch.testing.assert_close(cos.double(), torch.cos(angle), rtol=0, atol=1e-6)
    torch.testing.assert_close(sin.double(), torch.sin(angle), rtol=0, atol=1e-6)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("offset", [0.0, 1.0e5])
@pytest.mark.parametrize("block_elements", [1, 100, 1 << 18])
def test_the_timed_pair_in_blocks_equals_the_float64_reference_forward_and_backward(monkeypatch, gated, offset,
                                                                                      block_elements):
    # q̂ with the code's θ and k̂ without, from one set of features; blocks of one position, of a
    # few with a ragged last one, and one block for all; at τ ≈ 1e5 d/df carries τ: its float32
    # gradient is good to ~1e-7 of τ · (terms of size ~1)
    monkeypatch.setitem(BLOCK_ELEMENTS, "timed", (block_elements, block_elements))
    fast = _timed_inputs(gated=gated, seed=4)
    with torch.no_grad():
        fast[3] += offset
    k = torch.randn(fast[0].shape, generator=torch.Generator().manual_seed(6)).requires_grad_()
    slow = [t if t is None else t.detach().double().requires_grad_() for t in fast]
    k64 = k.detach().double().requires_grad_()
    q_hat, k_hat = apply_sine_code_timed_pair(fast[0], k, *fast[1:])
    ref_q = apply_sine_code_timed_reference(*slow)
    ref_k = apply_sine_code_timed_reference(k64, slow[1], None, *slow[3:])
    torch.testing.assert_close(q_hat.double(), ref_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_hat.double(), ref_k, rtol=1e-5, atol=1e-5)
    (q_hat.double() * k_hat.double()).sum().backward()
    (ref_q * ref_k).sum().backward()
    for name, a, b in zip(("q", "frequencies", "phases", "times", "weights", "gate"), fast, slow):
        if a is not None:
            atol = 1e-3 * max(1.0, offset / 1e3) if name == "frequencies" else 1e-5
            torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-4, atol=atol, msg=name)
    torch.testing.assert_close(k.grad.double(), k64.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("wanted", [(0,), (1,), (3,), (4,), (0, 3)])
def test_the_timed_product_gives_each_wanted_gradient_alone_as_with_every_other(wanted):
    # backward skips the products an input that needs no gradient would take (W's, the phases'):
    # asking for a subset must give the same gradients as asking for all
    names = ("q", "frequencies", "phases", "times", "weights")
    full = _timed_inputs(gated=False, seed=8)[:5]
    k = torch.randn(full[0].shape, generator=torch.Generator().manual_seed(9))
    some = [t.detach().clone().requires_grad_(i in wanted) for i, t in enumerate(full)]
    for inputs in (full, some):
        q_hat, k_hat = apply_sine_code_timed_pair(inputs[0], k, *inputs[1:], None, torch.zeros(2, 3, 6))
        (q_hat * k_hat).sum().backward()
    for i, name in enumerate(names):
        if i in wanted:
            torch.testing.assert_close(some[i].grad, full[i].grad, rtol=0, atol=0, msg=name)
        else:
            assert some[i].grad is None, name


def _pair_values_and_grads(seed=4, offset=1.0e5):
    # q̂, k̂ of the timed pair and every gradient of (q̂·k̂).sum(), in float32 and in the float64 reference
    fast = _timed_inputs(gated=True, seed=seed)
    with torch.no_grad():
        fast[3] += offset
    k = torch.randn(fast[0].shape, generator=torch.Generator().manual_seed(6)).requires_grad_()
    q_hat, k_hat = apply_sine_code_timed_pair(fast[0], k, *fast[1:])
    (q_hat * k_hat).sum().backward()
    return [q_hat.detach(), k_hat.detach(), k.grad] + [t.grad for t in fast if t is not None and t.grad is not None]


def test_the_compiled_product_equals_the_eager_one_and_the_float64_reference(monkeypatch):
    # COMPILE runs the same per-block functions through torch.compile (fused loops): values and
    # gradients must be the eager ones to float32 rounding (sums in another order), which the
    # float64 comparisons above tie to the definition; three blocks, one ragged
    monkeypatch.setitem(BLOCK_ELEMENTS, "timed", (100, 100))
    monkeypatch.setattr(timed_module, "COMPILE_MIN_POSITIONS", 1)
    monkeypatch.setattr(timed_module, "_COMPILED", {})
    monkeypatch.setattr(timed_module, "_COMPILE_FAILED", [])
    eager = _pair_values_and_grads()
    monkeypatch.setitem(timed_module.COMPILE, "cpu", True)
    compiled = _pair_values_and_grads()
    assert set(timed_module._COMPILED) == {"_features", "_feature_grads"} and not timed_module._COMPILE_FAILED
    assert len(compiled) == len(eager) == 10  # q̂, k̂, then the gradients of k and of the seven inputs
    for a, b in zip(compiled, eager):
        # float32 terms of size ~1 (d/df: ~τ = 1e5 times them): a few ulps of the largest
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


def test_a_compiler_that_fails_warns_once_and_the_eager_twin_runs(monkeypatch):
    monkeypatch.setattr(timed_module, "COMPILE_MIN_POSITIONS", 1)
    monkeypatch.setattr(timed_module, "_COMPILED", {})
    monkeypatch.setattr(timed_module, "_COMPILE_FAILED", [])
    eager = _pair_values_and_grads()
    monkeypatch.setitem(timed_module.COMPILE, "cpu", True)

    def no_compiler(fn, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", no_compiler)
    failed = r"torch.compile of the timed product failed \(RuntimeError: no C\+\+ compiler"
    with pytest.warns(RuntimeWarning, match=failed):
        fallback = _pair_values_and_grads()
    assert timed_module._COMPILE_FAILED == ["RuntimeError: no C++ compiler found"]
    for a, b in zip(fallback, eager):
        assert torch.equal(a, b)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: the next call runs eagerly without a word
        _pair_values_and_grads()


def test_blocks_of_a_few_positions_run_eagerly_under_compile(monkeypatch):
    # a decoding step's block: the compiled call's guards cost more than its loops save
    monkeypatch.setattr(timed_module, "_COMPILED", {})
    monkeypatch.setitem(timed_module.COMPILE, "cpu", True)
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: pytest.fail("compiled a 10-position block"))
    eager = _pair_values_and_grads()  # 2 sequences × 5 positions
    assert not timed_module._COMPILED and len(eager) == 10


def test_blocks_take_the_devices_budget_and_cover_every_position():
    # a CPU's block holds the first budget's features, a GPU's the second (larger: small blocks
    # left a learned-time step launch-bound on an H100); either way the blocks tile 0..N once
    h, k, d, n = 8, 5, 32, 300_000
    cpu, gpu = BLOCK_ELEMENTS["timed"]
    assert gpu > cpu
    for device, elements in ((torch.device("cpu"), cpu), (torch.device("cuda"), gpu)):
        blocks = list(timed_module._blocks(n, h, k, d, device))
        assert blocks[0] == (0, elements // (h * k * d))
        assert [s for s, _ in blocks[1:]] == [e for _, e in blocks[:-1]] and blocks[-1][1] == n


def test_the_filter_and_its_clock_equal_the_float64_composition_forward_and_backward():
    torch.manual_seed(0)
    h, d, c = 2, 4, 8
    filt = LearnedTimeSPEFilter(h, d, c, gated=True)
    _wind(filt, scale=0.7)
    code = SineSPE(h, d, 6, 3)(5)
    x, q, k = torch.randn(2, 5, c, requires_grad=True), torch.randn(2, 5, h, d), torch.randn(2, 5, h, d)
    times, _ = filt.prepare(x, None)
    qh, kh = filt.encode_queries_keys(q, k, code=code, context=times)
    ref_times = clock_reference(x, filt.clock.weight, filt.clock.bias)
    args = (code.frequencies, code.phases, ref_times, code.weights, filt.gate, code.gate_noise)
    ref = apply_sine_code_timed_reference(q, *args)
    torch.testing.assert_close(qh.double(), ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad((qh * kh).sum(), [x, filt.clock.weight, filt.clock.bias])
    ref_k = apply_sine_code_timed_reference(k, code.frequencies, None, *args[2:])
    ref_grads = torch.autograd.grad((ref * ref_k).sum(), [x, filt.clock.weight, filt.clock.bias])
    for a, b in zip(grads, ref_grads):
        assert b.abs().max() > 1e-3  # the clock is trained through the codes
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-5)


def test_monte_carlo_products_converge_to_the_kernel_at_the_clocks_lag_at_the_1_over_sqrt_r_rate():
    # E[q̂_m·k̂_n] = Σ_d q_d k_d P_d(τ_m − τ_n) / √(D R) · R (the filter's 1/(DR)^{1/4} on each side):
    # per realisation r, (DR)^{1/2} q̂_mr k̂_nr has mean Σ_d q_d k_d P_d(τ_m − τ_n).
    torch.manual_seed(0)
    h, d, c, n = 2, 3, 6, 6
    enc = SineSPE(h, d, num_sines=4, frequency_init="spread")
    with torch.no_grad():
        enc.phases.normal_()
    filt = LearnedTimeSPEFilter(h, d, c)
    _wind(filt, scale=1.0)
    x, q, k = torch.randn(1, n, c), torch.randn(1, n, h, d), torch.randn(1, n, h, d)
    with torch.no_grad():
        times, _ = filt.prepare(x, None)
        lag = times[0, -1] - times[0, 1]  # (H,) τ_5 − τ_1, far from the index lag 4
        assert (lag - 4).abs().min() > 0.25
        kernel = torch.stack([enc.kernel(lag[i].reshape(1).float())[i, :, 0] for i in range(h)])  # (H, D)
        target = (q[0, -1] * k[0, 1] * kernel).sum(-1).double()  # (H,)
        for r, seed in ((256, 1), (4096, 2), (32768, 3)):
            code = enc(n, num_realizations=r, generator=torch.Generator().manual_seed(seed))
            qh, kh = filt.encode_queries_keys(q, k, code=code, context=times)
            samples = (qh[0, -1] * kh[0, 1]).double() * math.sqrt(d * r)  # (H, R)
            err = (samples.mean(-1) - target).abs()
            stderr = samples.std(-1) / math.sqrt(r)
            # a Gaussian mean is within 4.5 standard errors with probability 1 − 7e-6 (fixed seeds)
            assert (err <= 4.5 * stderr).all(), (r, err, stderr)
        assert stderr.max() < 0.05 * samples.std(-1).max()  # the tolerance shrinks as 1/√R


@pytest.mark.parametrize("positional", ["sinespe", "rope"])
def test_at_the_start_learned_time_is_the_index_encoding(positional):
    index, learned = _model(positional, "performer", learned=False), _model(positional, "performer")
    missing = learned.load_state_dict(index.state_dict(), strict=False).missing_keys
    assert missing and all(".clock." in key for key in missing)
    tokens = torch.randint(0, 13, (2, 24), generator=torch.Generator().manual_seed(0))
    # same parameters, same code: the clock's τ_m = m (to float32 rounding of Δ = 1) gives the same logits
    torch.testing.assert_close(learned(tokens), index(tokens), rtol=1e-5, atol=1e-5)
    _wind(learned)
    assert (learned(tokens) - index(tokens)).abs().max() > 1e-4


@pytest.mark.parametrize("positional,attention,decay", [
    ("sinespe", "linear", "gated"), ("sinespe", "linear", "gated-channel"), ("sinespe", "performer", "none"),
    ("sinespe", "softmax", "gated"), ("sinespe", "linear-elu", "none"),
    ("rope", "linear-elu", "gated-channel"), ("rope", "softmax", "none"), ("rope", "linear", "gated"),
    ("rope", "performer", "gated")])
def test_learned_time_is_causal_and_decodes_step_by_step_as_the_parallel_forward(positional, attention, decay):
    model = _model(positional, attention, decay)
    _wind(model)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 13, (2, 12), generator=g)
    logits = model(tokens)
    changed = tokens.clone()
    changed[:, 7:] = torch.randint(0, 13, (2, 5), generator=g)
    other = model(changed)
    # causal, the clock included: positions < 7 never see tokens ≥ 7
    torch.testing.assert_close(other[:, :7], logits[:, :7], rtol=0, atol=1e-6)
    assert (other[:, 7:] - logits[:, 7:]).abs().max() > 1e-4
    prefix, state = model.prefill(tokens[:, :5])
    steps = [prefix]
    for t in range(5, 12):
        out, state = model.step(tokens[:, t], state)
        steps.append(out[:, None])
    torch.testing.assert_close(torch.cat(steps, 1), logits, rtol=1e-5, atol=1e-5)
    if attention != "softmax":  # a state passed on from a parallel pass (state passing, saved and read back) alike
        from spe.lab.music.state_passing import state_from_dict, state_to_dict

        head, carried = model(tokens[:, :5], return_state=True)
        tail, _ = model(tokens[:, 5:], state=state_from_dict(state_to_dict(carried)), return_state=True)
        torch.testing.assert_close(torch.cat([head, tail], 1), logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positional,attention", [("sinespe", "linear"), ("rope", "softmax")])
def test_learned_time_decodes_inside_fox_pros_block_with_a_short_convolution(positional, attention):
    # the clock's state wraps the short convolution's, which wraps the shift's: all carried
    from spe.attention.pro import PRO_OPTIONS

    model = _model(positional, attention, "gated", short_conv=3, **dict.fromkeys(PRO_OPTIONS, True))
    _wind(model)
    tokens = torch.randint(0, 13, (2, 10), generator=torch.Generator().manual_seed(2))
    logits, (prefix, state) = model(tokens), model.prefill(tokens[:, :4])
    steps = [prefix]
    for t in range(4, 10):
        out, state = model.step(tokens[:, t], state)
        steps.append(out[:, None])
    torch.testing.assert_close(torch.cat(steps, 1), logits, rtol=1e-5, atol=1e-5)


def test_a_layer_state_without_the_clock_is_refused():
    layer = MultiHeadAttention(16, 2, attention="linear-elu", positional=LearnedTimeRotary(16, 2))
    x = torch.randn(1, 2, 16)
    _, state = layer.step(x[:, :1], None, None)
    with pytest.raises(TypeError, match="rotary encoding .*state.*got LinearAttentionState"):
        layer.step(x[:, 1:], None, state.inner)


def test_rope_in_learned_time_is_relative_in_the_clock():
    # (R_{τ_m + c} q)·(R_{τ_n + c} k) = (R_{τ_m} q)·(R_{τ_n} k): shifting the clock changes no score
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 6, 2, 8, generator=g), torch.randn(2, 6, 2, 8, generator=g)
    times = (torch.rand(2, 6, 2, generator=g, dtype=torch.float64) * 2).cumsum(1)
    scores = torch.einsum("bmhe,bnhe->bhmn", rotate(q, times), rotate(k, times))
    shifted = torch.einsum("bmhe,bnhe->bhmn", rotate(q, times + 12345.25), rotate(k, times + 12345.25))
    torch.testing.assert_close(shifted, scores, rtol=1e-5, atol=1e-5)
    # and the clock's time is what it reads: rotating at the index instead changes them
    index = torch.einsum("bmhe,bnhe->bhmn", rotate(q, torch.arange(6)), rotate(k, torch.arange(6)))
    assert (index - scores).abs().max() > 1e-2
    # per-head times equal the shared positions when they are the same for every sequence and head
    same = torch.arange(6.0, dtype=torch.float64)[None, :, None].expand(2, 6, 2)
    torch.testing.assert_close(rotate(q, same), rotate(q, torch.arange(6)))
    with pytest.raises(ValueError, match=r"positions must have shape \(6,\) or \(batch, length, num_heads\)"):
        rotate(q, times[:, :, :1])


def test_an_encoder_clock_is_causal_and_padding_never_moves_a_real_position():
    torch.manual_seed(0)
    for module in (LearnedTimeSPEFilter(2, 8, 16), LearnedTimeRotary(16, 2)):
        _wind(module)
        layer = MultiHeadAttention(16, 2, attention="linear-elu", causal=False, positional=module,
                                   num_realizations=8 if isinstance(module, SPEFilter) else None)
        code = SineSPE(2, 8, 8)(9) if isinstance(module, SPEFilter) else None
        x = torch.randn(2, 9, 16)
        mask = torch.zeros(2, 9, dtype=torch.bool)
        mask[:, 6:] = True
        other = x.clone()
        other[:, 6:] = torch.randn(2, 3, 16)
        y = layer(x, code, key_padding_mask=mask)
        torch.testing.assert_close(layer(other, code, key_padding_mask=mask)[:, :6], y[:, :6], rtol=0, atol=1e-6)


def test_the_option_is_the_encodings_checked_and_recorded_in_checkpoints(tmp_path):
    from spe.checkpoint import load, save

    assert ModelConfig(vocab_size=5).spe_time == ModelConfig(vocab_size=5).rope_time == "index"
    with pytest.raises(ValueError, match="spe_time must be one of index, learned, onset, got 'clock'"):
        ModelConfig(vocab_size=5, spe_time="clock")
    with pytest.raises(ValueError, match="SPE oracle's scores .* spe_time 'index', got 'learned'"):
        DecoderLM(ModelConfig(vocab_size=5, d_model=16, num_heads=2, positional="sinespe-exact", attention="softmax",
                              spe_time="learned"))
    model = _model("rope", "softmax")
    _wind(model)
    tokens = torch.randint(0, 13, (1, 10))
    loaded = load(save(model, tmp_path / "rope"))
    assert loaded.model.config.rope_time == "learned"
    torch.testing.assert_close(loaded.model(tokens), model(tokens))
    # a header written before the option existed loads as index time
    old = ModelConfig.from_dict({k: v for k, v in model.config.to_dict().items() if k not in ("rope_time", "spe_time")})
    assert old.rope_time == "index" and isinstance(DecoderLM(old).blocks[0].attn.rotary, RotaryEncoding)
    assert not isinstance(DecoderLM(old).blocks[0].attn.rotary, LearnedTimeRotary)


@pytest.mark.parametrize("positional,extra", [("sinespe", ["--spe-time", "learned", "--decay", "gated"]),
                                              ("rope", ["--rope-time", "learned", "--attention", "linear"]),
                                              ("sinespe", ["--spe-time", "onset", "--attention", "linear"])])
@pytest.mark.slow
def test_spe_train_trains_learned_time_and_generates_from_its_checkpoint(midi_folder, tmp_path, positional, extra):
    from spe.checkpoint import load_metadata
    from spe.lab.cli.main import main

    run = tmp_path / positional
    tiny = ["--seq-len", "16", "--batch-size", "2", "--d-model", "16", "--num-layers", "1", "--num-heads", "2",
            "--eval-every", "2", "--threads", "1", "--steps", "3", "--no-progress"]
    with pytest.warns(UserWarning, match="broken.mid"):
        assert main(["train", "--data", str(midi_folder), "--cache-dir", str(tmp_path / "cache"), "--out", str(run),
                     "--positional", positional, *extra, *tiny]) == 0
    config = load_metadata(run)["config"]
    assert config["spe_time" if positional == "sinespe" else "rope_time"] == extra[1]
    if extra[1] == "onset":  # the scale and the clock's tokens of the training split, kept for generation
        from spe.encodings.onset import OnsetClock, tokens_per_beat
        from spe.lab.music.corpus import make_tokenizer
        from spe.lab.music.split import load_split

        from spe.lab.music.config import TrainConfig

        cfg = TrainConfig()  # the defaults spe train split the data with
        split = load_split(str(midi_folder), cache_dir=str(tmp_path / "cache"), val_fraction=cfg.val_fraction,
                           split_seed=cfg.split_seed, max_piece_tokens=cfg.max_piece_tokens,
                           test_min_tokens=cfg.test_min_tokens, num_test_pieces=cfg.num_test_pieces)
        clock = OnsetClock(config["onset_tokens"], len(make_tokenizer()))
        assert config["onset_scale"] == pytest.approx(tokens_per_beat(split.train_pieces, clock), rel=1e-12)
        # a resumed run reads the same data: the settings it gives are no change of options
        assert main(["train", "--data", str(midi_folder), "--cache-dir", str(tmp_path / "cache"), "--out", str(run),
                     "--positional", positional, *extra, *tiny[:-3], "--steps", "4", "--no-progress", "--resume"]) == 0
        assert load_metadata(run)["step"] == 4
    assert main(["generate", "--checkpoint", str(run), "--length", "40", "--out", str(tmp_path / "new.mid"),
                 "--no-progress"]) == 0
    with pytest.raises(SystemExit) as refused:  # argparse: one line, exit 2
        main(["train", "--data", str(midi_folder), "--out", str(tmp_path / "bad"), "--spe-time", "clock", *tiny])
    assert refused.value.code == 2
