"""The memory of evaluating a model at a length, estimated from its config before it runs.

Teacher-forced evaluation runs one forward pass per batch without gradients: the layers run one
after another, so the peak is the batch's activations and logits plus the largest transient of
one attention layer. That transient is linear in the length for linear kernels and PyTorch's
fused softmax, but quadratic where attention is formed as an L × L matrix (PaTH below
:data:`~spe.ops.path.flash.FLASH_MIN_LENGTH` positions (its spec's ``linear_from``), score encodings,
softmax with a mask or an SPE code whose size differs from the values'), and FoX holds blocks of
:data:`~spe.ops.softmax.FOX_QUERY_BLOCK` queries × L keys below
:data:`~spe.ops.softmax.FLASH_FOX_MIN_LENGTH` positions, of :data:`~spe.ops.softmax.FLASH_FOX_BLOCK`
from there on (its flash-style form). A 41,000-token piece on a tiny PaTH
model would need tens of GB: :func:`check_evaluation_memory` refuses that before any forward
pass, naming the estimate, the memory available and the largest length that fits.

The constants are bytes per element of the (B, H, L, L) scores, measured as the peak resident
memory of one forward pass on the CPU (float32, PyTorch 2.x) at L = 1,024 to 8,192 and rounded
up. An encoding that forms the scores declares its own
(:attr:`~spe.encodings.spec.PositionalSpec.score_bytes`, ``pair_bytes``: PaTH 9.8, relative terms
8.3 to 12.5, Shaw's relative values ~8.5 per (L, L, D) element besides); a forget gate on its
logits adds its (B, H, L, L) bias (PaTH-FoX: 16.8 in all); softmax through its unfused path takes
6.3 (a window's mask) to 10.6 (an SPE code), FoX's blocks 12 to 16. Estimates are within
0.9-1.2× of those measurements (1.5× for the SPE oracle); ``spe evaluate`` of a tiny PaTH model
(d_model 32, 2 heads) at 6,000 positions is estimated at 783 MB, and under ``ulimit -v`` the
lengths the refusal proposes ran. On CUDA what FlexAttention takes (FoX's gate, a window, a score
term with ``flex_arguments``) forms no L × L matrix and counts as linear; the rest keeps the
CPU's constants, an upper bound there.

Letters: B = sequences per batch, L = positions, H = heads, D = head size, C = d_model,
V = vocabulary.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from spe.encodings.registry import POSITIONAL_SPECS
from spe.lab.engine.memory import format_bytes
from spe.ops.path.flash import FLASH_BLOCK, FLASH_TILE
from spe.ops.softmax import FLASH_FOX_BLOCK, FLASH_FOX_MIN_LENGTH, FOX_QUERY_BLOCK

__all__ = ["available_memory", "check_evaluation_memory", "evaluation_bytes", "largest_length",
           "out_of_memory_error"]

# bytes per (B, H, L, L) score element (see the module's docstring): a gate's bias on formed
# scores, softmax's unfused path, FoX's blocks of queries
_GATE_BIAS_BYTES, _UNFUSED_BYTES, _FOX_BYTES = 7.0, 11.0, 16.0
# per element of FoX's flash-style blocks (queries of a block x the keys it reaches: its mask and
# SDPA's transient), from FLASH_FOX_MIN_LENGTH positions on; measured 3.3 (B 1, H 2, L 8,192)
_FOX_FLASH_BYTES = 4.0
# PaTH's flash-style form from FLASH_MIN_LENGTH positions on (spe.ops.path.flash): per element of
# the keys carried chunk by chunk (B, H, L, D) and of one block x tile of logits; measured
# 30 per key element (B 1, H 2, D 16, L 8,192: 8 MB above softmax alone)
_PATH_FLASH_KEY_BYTES, _PATH_FLASH_LOGIT_BYTES = 32.0, 16.0
# per position and sequence: logits and their log-softmax (V), the residual stream and its
# projections (C), the kernel's features (H × F)
_LOGIT_BYTES, _STREAM_BYTES, _FEATURE_BYTES = 12, 32, 64
_CODE_BYTES = 12  # per element of a materialised (L, H, D, R) SPE code and its products
_MATERIALISED_CODE = 2 ** 24  # the most elements impl="auto" materialises (spe.encodings.filter)


def _score_kind(config, length: int, realizations: int | None = None,
                device: torch.device | str = "cpu") -> str | None:
    """What forms a (B, H, L, L) matrix in this config's attention: ``scores`` (an encoding that
    forms them), ``flash-scores`` (an encoding's flash-style form, from its ``linear_from``: linear),
    ``fox`` (FoX's blocks), ``unfused`` (softmax's path that forms them), ``blocks``
    (block-local attention: (L, 2N) scores, :mod:`spe.ops.softmax.local`), or None
    (linear memory). On CUDA FlexAttention takes FoX's gate, a window and a score term that has
    ``flex_arguments`` (:func:`spe.ops.softmax.flex.choose_softmax_impl`): none forms the matrix."""
    spec = POSITIONAL_SPECS[config.positional]
    cuda = torch.device(device).type == "cuda"
    if getattr(config, "attention_blocks", 0):
        return "blocks"  # block-local attention: (L, 2N) scores, never L × L
    if spec.acts_on == "scores":
        if spec.linear_from is not None and length >= spec.linear_from:
            return "flash-scores"  # the encoding's flash-style form (PaTH's: its blocks' constants below)
        square = spec.score_bytes or spec.pair_bytes
        return None if not square or (cuda and _takes_flex(spec, config)) else "scores"
    if config.attention != "softmax":
        return None
    if config.decay == "gated":
        return None if cuda else "fox"
    window = getattr(config, "attention_window", None)
    realizations = realizations or config.num_realizations
    if (window is not None and window < length and not cuda) or (
            spec.stochastic and realizations != config.d_model // config.num_heads):
        return "unfused"  # a mask, or queries and keys of another size than the values
    return None


def _takes_flex(spec, config) -> bool:
    """Whether the encoding's score term goes to FlexAttention (its module has ``flex_arguments``;
    built on the meta device: no storage)."""
    try:
        with torch.device("meta"):
            return hasattr(spec.build_layer_module(config, causal=True), "flex_arguments")
    except (RuntimeError, ValueError, TypeError):
        return False


def evaluation_bytes(config, length: int, batch: int, *, num_realizations: int | None = None,
                     device: torch.device | str = "cpu") -> int:
    """Estimated peak bytes, beyond the loaded model, of one forward pass over ``batch`` sequences
    of ``length`` positions (float32, no gradients).

    Args:
        config: the model's :class:`~spe.models.ModelConfig`.
        length: L, positions per sequence.
        batch: B, sequences per forward pass.
        num_realizations: R at test time (None: the model's).
        device: where it runs (CUDA's FlexAttention forms no L × L matrix for some mechanisms).

    Returns:
        Bytes: the batch's logits, activations and features (linear in B·L), the SPE code (linear
        in L, up to what is materialised) and the attention's L × L transient where it has one.
    """
    heads, head = config.num_heads, config.d_model // config.num_heads
    stochastic = POSITIONAL_SPECS[config.positional].stochastic
    realizations = num_realizations or config.num_realizations
    features = max(head, realizations if stochastic else 0,
                   config.num_features if config.attention == "performer" else 0)
    need = batch * length * (_LOGIT_BYTES * config.vocab_size + _STREAM_BYTES * config.d_model
                             + _FEATURE_BYTES * heads * features)
    if stochastic:
        need += _CODE_BYTES * min(length * heads * head * realizations, _MATERIALISED_CODE)
    kind, spec = _score_kind(config, length, realizations, device), POSITIONAL_SPECS[config.positional]
    if kind == "fox" and length >= FLASH_FOX_MIN_LENGTH:
        need += _FOX_FLASH_BYTES * batch * heads * min(length, FLASH_FOX_BLOCK) * length
    elif kind == "fox":
        need += _FOX_BYTES * batch * heads * min(length, FOX_QUERY_BLOCK) * length
    elif kind == "flash-scores":
        need += batch * heads * (_PATH_FLASH_KEY_BYTES * length * head
                                 + _PATH_FLASH_LOGIT_BYTES * FLASH_BLOCK * FLASH_TILE)
    elif kind == "unfused":
        need += _UNFUSED_BYTES * batch * heads * length * length
    elif kind == "blocks":  # each query's window of 2N keys, as the score element it forms (not measured)
        window = 2 * config.attention_blocks
        per = spec.score_bytes if spec.acts_on == "scores" else _UNFUSED_BYTES
        need += per * batch * heads * length * window + spec.pair_bytes * config.attention_blocks * window * head
    elif kind == "scores":
        gate = _GATE_BIAS_BYTES if spec.takes_gate and config.decay == "gated" else 0.0
        need += (spec.score_bytes + gate) * batch * heads * length * length + spec.pair_bytes * length * length * head
    return int(need)


def available_memory(device: torch.device | str) -> int | None:
    """Bytes that can still be allocated on ``device``: a CUDA device's free memory
    (``torch.cuda.mem_get_info``), else the machine's available memory (psutil if installed,
    else /proc/meminfo's MemAvailable), no more than what the process's cgroup and its
    ``ulimit -v`` still allow; None where none of these can be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        import psutil

        have = int(psutil.virtual_memory().available)
    except ImportError:
        have = _meminfo_available()
    rooms = [room for room in (have, _cgroup_room(), _address_space_room()) if room is not None]
    return min(rooms) if rooms else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """What the cgroup (v2) of this process may still allocate, or None (no limit, or unreadable)."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        return None


def _address_space_room() -> int | None:
    """What ``ulimit -v`` (RLIMIT_AS) still leaves this process: the limit less its virtual size
    (/proc/self/status VmSize); None without a limit or where it cannot be read."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return None
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return max(0, limit - int(line.split()[1]) * 1024)
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return None


def largest_length(config, batch: int, budget: int, upper: int, **options) -> int:
    """The largest L ≤ ``upper`` whose :func:`evaluation_bytes` (with ``options``: ``num_realizations``,
    ``device``) fits in ``budget`` (0 if none).

    The estimate grows with L except where a kernel switches to its flash-style form
    (the encoding's ``linear_from``, PaTH's flash form; :data:`FLASH_FOX_MIN_LENGTH` for FoX), where it
    drops: each stretch between those lengths is searched on its own, the longest first."""
    switches = (POSITIONAL_SPECS[config.positional].linear_from, FLASH_FOX_MIN_LENGTH)
    edges = sorted({0, *(e for e in switches if e is not None and 0 < e <= upper)}, reverse=True)
    top = upper
    for start in edges:
        low, high = start - 1, top  # low: known to fit (start - 1 stands for "none in this stretch")
        while low < high:
            mid = (low + high + 1) // 2
            if evaluation_bytes(config, mid, batch, **options) <= budget:
                low = mid
            else:
                high = mid - 1
        if low >= max(start, 1):
            return low
        top = start - 1
    return 0


def check_evaluation_memory(path: str | os.PathLike, config, length: int, batch: int,
                            device: torch.device | str, *, flag: str = "--eval-length", default: bool = False,
                            num_realizations: int | None = None) -> None:
    """Raises ValueError (one line) if evaluating ``config`` at ``length`` on ``batch`` sequences
    cannot fit in the memory available (:func:`available_memory`); does nothing where that is unknown.

    Args:
        path: the checkpoint, for the message.
        config: its model config.
        length: L, the positions asked for.
        batch: B, sequences per forward pass.
        device: where it runs.
        flag: how the message names the length option.
        default: the length is the default one (not given with ``flag``).
        num_realizations: SPE's R at test time (None: the model's).

    Raises:
        ValueError: naming the estimate, the memory available, the largest length that fits at
            this batch size (and at one sequence per batch, where that is larger).
    """
    have = available_memory(device)
    options = {"num_realizations": num_realizations, "device": device}
    need = evaluation_bytes(config, length, batch, **options)
    if have is None or need <= have:
        return
    fits = largest_length(config, batch, have, length, **options)
    alone = largest_length(config, 1, have, length, **options) if batch > 1 else fits
    hint = f"{flag} {fits} fits" if fits else "no length fits"
    if alone > fits:
        hint += f" ({alone} with --batch-size 1)"
    asked = f"the default length {length}" if default else f"{flag} {length}"
    raise ValueError(f"{path} at {asked} needs about {format_bytes(need)} ({_what(config, length, device)}, "
                     f"{batch} sequence(s) per batch) but {torch.device(device).type} memory available is "
                     f"{format_bytes(have)}: {hint}")


def _what(config, length: int, device: torch.device | str) -> str:
    kind = _score_kind(config, length, device=device)
    where = f"positional {config.positional}, attention {config.attention}" + (
        f", decay {config.decay}" if config.decay != "none" else "")
    if kind is None or kind == "flash-scores" or (kind == "fox" and length >= FLASH_FOX_MIN_LENGTH):
        return where + ": linear in the length"
    return where + (": blocks of queries × the length" if kind == "fox" else ": quadratic in the length")


def out_of_memory_error(err: BaseException) -> bool:
    """Whether ``err`` is the allocator's failure (CUDA's OutOfMemoryError, the CPU allocator's
    RuntimeError, Python's MemoryError) rather than another error."""
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and ("alloc" in text and "memory" in text)
