"""One benchmark measurement, run in its own process so that peak memory can be read.

Usage: ``python -m spe.lab.bench.worker '<json case>'``; prints one JSON line.
Peak memory on CPU is the growth of the process's maximum resident set size over the
workload (``ru_maxrss``); on CUDA, ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
import warnings

import torch

from spe.attention.fourier import MIXERS, FourierMixer
from spe.attention.layer import MultiHeadAttention
from spe.lab.bench.forms import measure_in_form
from spe.lab.bench.peers import PEER_ATTENTIONS, build_peer_layer
from spe.encodings.conv import ConvSPE
from spe.encodings.filter import IMPLS
from spe.ops.sine.timed import compile_products
from spe.ops.sine.costs import choose_sine_impl
from spe.encodings.registry import positional_spec
from spe.ops.common.state import KVCache, LinearAttentionState, ScaledLinearAttentionState
from spe.ops.fourier import FourierState


def _autocast(case: dict, device: torch.device):
    """The case's ``precision`` autocast (``spe bench --precision``; a no-op for fp32)."""
    from spe.lab.engine.precision import autocast

    return autocast(case.get("precision", "fp32"), device.type)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _head_dim(config) -> int:
    return config.d_model // config.num_heads


def _spe_impl(case: dict) -> str:
    """``ModelConfig.spe_impl`` of a case: its sineSPE ``impl``, convSPE's "materialized"/"blocked",
    or ``auto`` ("-", and convSPE's "fft"/"direct", which concern the code, not its application)."""
    if case["positional"] == "convspe":
        return case["impl"] if case["impl"] in ("materialized", "blocked") else "auto"
    return case["impl"] if case["positional"] == "sinespe" and case["impl"] in IMPLS else "auto"


def _layer_config(case: dict):
    """The ModelConfig whose fields the registry's builders read, for one bench layer."""
    from spe.models import ModelConfig

    h, d = case["num_heads"], case["head_dim"]
    return ModelConfig(vocab_size=1, d_model=h * d, num_heads=h, positional=case["positional"],
                       attention=case["attention"],
                       num_realizations=case["num_realizations"], num_sines=case["num_sines"],
                       kernel_size=case["kernel_size"], max_distance=_max_distance(case),
                       max_positions=case["length"] + 1, gated=True, num_features=case["num_features"],
                       chunk_size=case["chunk_size"], spe_impl=_spe_impl(case), decay=_decay(case))


def _max_distance(case: dict) -> int:
    """A distance table's size: the case's (default 256), at least 2N − 1 under block-local attention
    of N positions (as ``spe train`` gives it)."""
    return max(case.get("max_distance", 256), 2 * (case.get("attention_blocks") or 0) - 1)


def _decay(case: dict) -> str:
    """The case's decay (``--decay``) where its kernel takes it (softmax: the FoX gate only), else none."""
    from spe.lab.bench.targets import takes_decay

    decay = case.get("decay", "none")
    return decay if decay == "none" or takes_decay(case["attention"], decay) else "none"


def build(case: dict, device: torch.device | str = "cpu"):
    """(attention layer, SPE code generator or None, token encoding or None) from the registry,
    each on ``device`` (the token encoding too: sinusoidal APE keeps its frequencies in a buffer).

    The registry builds what a DecoderLM layer would get, with the case's sineSPE ``impl`` as
    ``ModelConfig.spe_impl``; a convSPE ``impl`` then picks how ConvSPE filters its noise.
    """
    if case["attention"] in MIXERS:
        return _build_mixer(case, device)
    peer = case["attention"] in PEER_ATTENTIONS
    config = _layer_config({**case, "attention": "performer"} if peer else case)
    spec = positional_spec(case["positional"])
    per_model = spec.build_model_module(config)
    layer_module = spec.build_layer_module(config, causal=True)
    encoding = per_model if spec.stochastic else None
    ape = per_model if spec.acts_on == "tokens" else None
    if isinstance(encoding, ConvSPE):
        encoding.impl = "direct" if case["impl"] == "direct" else "fft"
    if peer:  # another package's layer, with APE or nothing (spe.lab.bench.peers)
        layer = build_peer_layer(case["attention"], config.num_heads, _head_dim(config), config.num_features)
        encoding = None
    else:
        layer = MultiHeadAttention(config.d_model, config.num_heads, attention=config.attention, causal=True,
                                   num_realizations=config.num_realizations if spec.stochastic else None,
                                   num_features=config.num_features, chunk_size=config.chunk_size,
                                   decay=config.decay, positional=layer_module,
                                   softmax_impl=case.get("softmax_impl", "auto"),
                                   attention_blocks=case.get("attention_blocks") or None)
    return tuple(None if m is None else m.to(device) for m in (layer, encoding, ape))


def _build_mixer(case: dict, device: torch.device | str):
    """(Fourier mixer, None, token encoding or None): ``fnet``, or ``fnet-causal`` with N = the case's
    length (what ``spe train --seq-len N`` gives it)."""
    spec = positional_spec(case["positional"])
    ape = spec.build_model_module(_layer_config({**case, "attention": "softmax"})) if spec.acts_on == "tokens" else None
    layer = FourierMixer(case["attention"], length=case["length"] if MIXERS[case["attention"]].causal else None)
    return layer.to(device), None, None if ape is None else ape.to(device)


def measure_model(case: dict, device: torch.device) -> dict:
    """One optimizer step (forward, backward, AdamW) of a whole DecoderLM; reports its parameters
    (see :func:`model_step`)."""
    run, extra = model_step(case, device)
    return {**_timed(run, case, device), **extra}


def model_step(case: dict, device: torch.device):
    """(a function doing one AdamW step of a whole DecoderLM, {"parameters", "attention_window",
    "decay"(, "resolved_impl")}).

    With ``case["compiled"]`` the model's forward is ``torch.compile``d (the timed steps follow
    the untimed, compiling first one). The model is the one ``spe train --seq-len N`` builds from ``case["model"]``: the config
    layer's defaults apply (:func:`spe.lab.music.config.resolve_model_options`), so SPE gets a
    sliding window of N positions, which at length N reaches the whole past (the kernels then
    take their whole-past path). A sineSPE ``impl`` other than "-" becomes ``ModelConfig.spe_impl``.
    """
    from spe.models import DecoderLM, ModelConfig
    from spe.models.loss import cross_entropy
    from spe.lab.music.config import resolve_model_options

    n, b = case["length"], case["batch"]
    options = dict(case["model"])
    options.update(positional=case["positional"], attention=case["attention"])
    if "decay" in case:  # --decay's mode for this case, over the model options'
        options["decay"] = case["decay"]
    options["decay"] = _decay({"attention": options["attention"], "decay": options.get("decay", "none")})
    options = resolve_model_options(options, seq_len=n)
    options["max_positions"] = max(options.get("max_positions", 2048), n)
    config = ModelConfig(vocab_size=case["vocab_size"], **{**options, "spe_impl": _spe_impl(case)})
    model = DecoderLM(config).to(device).train()
    forward = torch.compile(model) if case.get("compiled") else model  # as spe train --compile does
    if case.get("compiled"):
        compile_products(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, case["vocab_size"], (b, n + 1), generator=g, device=device)

    from spe.lab.engine.precision import grad_scaler

    scaler = grad_scaler(case.get("precision", "fp32"), device.type)  # fp16: as spe train steps

    def run() -> None:
        with _autocast(case, device):
            loss = cross_entropy(forward(tokens[:, :-1]), tokens[:, 1:])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    extra = {"parameters": model.num_parameters(), "attention_window": config.attention_window,
             "decay": config.decay}
    if case["positional"] == "sinespe" and case["impl"] == "-":
        # a clock's codes differ per sequence: one path (spe.ops.sine.timed), not the index choice
        extra["resolved_impl"] = "timed" if config.spe_time != "index" else choose_sine_impl(
            b, n, config.num_heads, config.d_model // config.num_heads, config.num_sines, config.num_realizations)
    return run, extra


def measure_train(case: dict, device: torch.device) -> dict:
    layer, encoding, ape = build(case, device)
    n, b = case["length"], case["batch"]
    x = torch.randn(b, n, case["num_heads"] * case["head_dim"], device=device, requires_grad=True)
    g = torch.Generator().manual_seed(0)
    params = list(layer.parameters()) + (list(encoding.parameters()) if encoding is not None else [])

    def run() -> None:
        with _autocast(case, device):
            inp = ape(x, torch.arange(n, device=device)) if ape is not None else x
            code = encoding(n, generator=g) if encoding is not None else None
            loss = layer(inp, code).float().square().mean()
        loss.backward()
        for p in params + [x]:
            p.grad = None

    return _timed(run, case, device)


@torch.no_grad()
def measure_generate(case: dict, device: torch.device) -> dict:
    """Per-token cost of one recurrent step at position ``length`` (state of that many tokens)."""
    layer, encoding, ape = build(case, device)
    n, b, h, d = case["length"], case["batch"], case["num_heads"], case["head_dim"]
    x = torch.randn(b, 1, h * d, device=device)
    if case["attention"] in MIXERS:  # every frequency of the prefix, N = the length (O(N·C) a step)
        state = FourierState(sums=torch.randn(b, n, h * d, dtype=torch.complex64, device=device), position=n)
    elif case["attention"] == "softmax":
        e = case["num_realizations"] if encoding is not None else d
        # FoX keeps each cached key's summed log gate up to the newest position (≤ 0)
        gate = {"key_log_decay": -torch.rand(b, n, h, device=device)} if _decay(case) != "none" else {}
        blocks = case.get("attention_blocks")  # block-local: the cache holds the previous block on
        kept = n if not blocks else n - max(0, ((n - 1) // blocks - 1) * blocks)
        state = KVCache(keys=torch.randn(b, kept, h, e, device=device),
                        values=torch.randn(b, kept, h, d, device=device), position=n, **gate)
        own_state = getattr(layer.score_encoding, "decoding_state", None)  # PaTH keeps its own cache type
        if callable(own_state):
            state = own_state(state)
    else:
        m, m_den = layer.feature_sizes()  # some feature transforms double M
        sums = {"kv": torch.rand(b, h, m, d, device=device), "normalizer": torch.rand(b, h, m_den, device=device),
                "position": n}
        # FAVOR+ sums are kept relative to a running log scale (spe.ops.common.scaled); 0 = absolute
        state = (ScaledLinearAttentionState(**sums, log_scale=torch.zeros(b, h, device=device))
                 if case["attention"] == "performer" else LinearAttentionState(**sums))
    pos = torch.tensor([n], device=device)

    def run() -> None:
        with _autocast(case, device):
            inp = ape(x, pos) if ape is not None else x
            code = encoding(positions=pos, generator=torch.Generator().manual_seed(0)) if encoding is not None else None
            layer.step(inp, code, state)  # the state is not advanced: every call costs the same

    return _timed(run, case, device)


@torch.no_grad()
def measure_prefill(case: dict, device: torch.device) -> dict:
    """One causal layer reading a prompt of ``length`` positions in one pass (``prefill``: the
    output and the decoding state), the parallel counterpart of ``length`` generate steps."""
    layer, encoding, ape = build(case, device)
    n, b, h, d = case["length"], case["batch"], case["num_heads"], case["head_dim"]
    x = torch.randn(b, n, h * d, device=device)
    pos = torch.arange(n, device=device)

    def run() -> None:
        with _autocast(case, device):
            inp = ape(x, pos) if ape is not None else x
            code = encoding(positions=pos, generator=torch.Generator().manual_seed(0)) if encoding is not None else None
            layer.prefill(inp, code)

    return _timed(run, case, device)


def _timed(run, case: dict, device: torch.device) -> dict:
    """Median time of ``repeats`` calls after a warm-up call, and the peak memory over all;
    ``repeats`` 0 times the warm-up call itself (a memory probe: the first step already holds
    everything a later one does, e.g. AdamW's moments)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_mb()
    t = time.perf_counter()
    run()  # warm-up
    times = [] if case["repeats"] else [time.perf_counter() - t]
    deadline = time.perf_counter() + case.get("max_seconds", 30.0)
    for _ in range(case["repeats"]):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        if time.perf_counter() > deadline and len(times) >= 3:
            break
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if device.type == "cuda" else _rss_mb() - base
    return {"median_ms": 1000 * statistics.median(times), "peak_mb": peak, "repeats": len(times),
            "times_ms": [1000 * t for t in times], "base_mb": base if device.type != "cuda" else base / 2**20}


def measure_recording_fallbacks(measure, case: dict, device: torch.device) -> dict:
    """``measure(case, device)``'s record, with ``softmax_fallback``: the warning of a forced
    FlexAttention that fell back to the per-block form (``spe bench --softmax-impl flex``), so
    that no row names a path it did not take. Other warnings are shown as usual."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = measure(case, device)
    for w in caught:
        if "falls back to the per-block softmax" in str(w.message):
            result["softmax_fallback"] = str(w.message)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return result


def measure_case(case: dict, device: torch.device) -> dict:
    """The measurement of ``case`` in its mode: FoX's and PaTH's kernel form forced where it asks
    for one (``spe bench --fox-path-impl``, :func:`spe.lab.bench.forms.measure_in_form`), a forced
    FlexAttention's fallback recorded (:func:`measure_recording_fallbacks`)."""
    measure = {"train": measure_train, "generate": measure_generate, "prefill": measure_prefill,
               "model": measure_model}[case["mode"]]
    return measure_recording_fallbacks(lambda c, d: measure_in_form(measure, c, d), case, device)


def main() -> None:
    case = json.loads(sys.argv[1])
    torch.set_num_threads(case.get("threads") or torch.get_num_threads())
    device = torch.device(case.get("device", "cpu"))
    try:
        result = measure_case(case, device)
    except ImportError as e:  # an optional peer package (spe.lab.bench.peers) is not installed
        if case["attention"] not in PEER_ATTENTIONS:
            raise
        print(json.dumps({**case, "skipped": f"{PEER_ATTENTIONS[case['attention']]} not installed ({e})"}))
        return
    if case["mode"] in ("generate", "prefill"):
        result["per_token_ms"] = result["median_ms"] / (case["length"] if case["mode"] == "prefill" else 1)
    if case["mode"] != "model" and case["attention"] not in PEER_ATTENTIONS:
        result["decay"] = _decay(case)  # what the layer was built with (softmax: none)
    if case["positional"] == "sinespe" and case["impl"] == "-" and case["mode"] != "model":
        length = case["length"] if case["mode"] == "train" else 1
        result["resolved_impl"] = choose_sine_impl(case["batch"], length, case["num_heads"], case["head_dim"],
                                                   case["num_sines"], case["num_realizations"])
    print(json.dumps({**case, **result}))


if __name__ == "__main__":
    main()
