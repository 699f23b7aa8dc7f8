"""Sampling from a decoder LM: nucleus (top-p) sampling with temperature and a grammar mask.

Letters: V = vocab_size.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch
from torch import Tensor

from spe.models.decoder_lm import DecoderLM

__all__ = ["check_sampling", "generate", "nucleus_filter", "sample_next"]


def nucleus_filter(logits: Tensor, top_p: float) -> Tensor:
    """Keeps the smallest set of tokens whose probability reaches ``top_p`` (Holtzman et al. 2020).

    Args:
        logits: (V,) or (B, V).
        top_p: in (0, 1]; 1 keeps every token.

    Returns:
        Logits of the same shape with the excluded tokens at −inf (the most likely is always kept).

    Raises:
        ValueError: if ``top_p`` is outside (0, 1].
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
    drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p  # mass before this token
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def check_sampling(*, top_p: float, temperature: float, top_p_name: str = "top_p",
                   temperature_name: str = "temperature") -> None:
    """Validates the sampling options (the one rule, also used by ``spe generate`` for its flags).

    Args:
        top_p: nucleus mass, in (0, 1].
        temperature: softmax temperature, finite and > 0. Any positive value works, however
            small: :func:`sample_next` turns an overflow into the t → 0 limit (greedy decoding).
        top_p_name, temperature_name: how the caller names the options in messages.

    Raises:
        ValueError: naming the option and the value (NaN and ±inf included).
    """
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not (
            math.isfinite(float(temperature)) and temperature > 0):
        raise ValueError(f"{temperature_name} must be a finite positive number, got {temperature!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"{top_p_name} must be in (0, 1], got {top_p!r}")


def sample_next(logits: Tensor, *, top_p: float, temperature: float, allowed: Tensor | None,
                generator: torch.Generator | None) -> int:
    """Draws one token id from (V,) logits: mask, then temperature, then nucleus.

    When ``logits / temperature`` overflows float32 (a tiny temperature such as 1e-40), the
    logits are shifted to a maximum of 0 and divided in float64 instead: finite for any
    t > 0, so the draw is the t → 0 limit, the most likely allowed token (ties shared),
    rather than inf − inf = NaN. Other temperatures take the float32 path unchanged (the
    same draws as before for the same generator).

    Raises:
        ValueError: as :func:`check_sampling`.
    """
    check_sampling(top_p=top_p, temperature=temperature)
    logits = logits.float().cpu()
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    scaled = logits / temperature
    if bool(scaled.isnan().any()) or float(scaled.max()) == float("inf"):
        scaled = (logits.double() - logits.max()) / temperature  # max 0; -inf stays -inf
    logits = nucleus_filter(scaled, top_p)
    return int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))


@torch.no_grad()
def generate(model: DecoderLM, prompt: list[int], num_tokens: int, *, top_p: float = 0.9,
             temperature: float = 1.2, allowed_next: Callable[[list[int]], Tensor] | None = None,
             generator: torch.Generator | None = None, progress: bool = False) -> list[int]:
    """Continues ``prompt`` by ``num_tokens`` sampled tokens, with recurrent decoding.

    The prompt is read in one parallel pass (:meth:`DecoderLM.prefill`, which returns the
    decoding state after it), then every new token takes one :meth:`DecoderLM.step`: in eval
    mode its positional code is the one the parallel forward uses, and with linear attention
    every token costs the same whatever its position, so generation may run far past the
    training length. The draws are those of feeding the prompt step by step (the same
    logits within float rounding). Each token is drawn by :func:`sample_next`: the
    ``allowed_next`` mask, then ``temperature``, then nucleus (top-p) filtering. One sequence
    at a time (batch 1); the model is put in eval mode.

    Args:
        model: the language model (``spe.load(path).model`` for a saved one).
        prompt: token ids in [0, V) to start from (may be empty: the first token is then
            drawn from uniform logits, restricted by ``allowed_next``).
        num_tokens: tokens to add, ≥ 0.
        top_p: nucleus mass, in (0, 1] (appendix C.1 of Liutkus et al. 2021: 0.9).
        temperature: softmax temperature, finite and > 0 (appendix C.1: 1.2).
        allowed_next: maps the sequence so far (a list of ids) to a (V,) bool mask of the
            allowed next tokens (a grammar); None: every token.
        generator: source of the sampling randomness (a seeded CPU generator makes the
            draws reproducible).
        progress: show a progress bar (needs ``tqdm``).

    Returns:
        ``prompt`` + the new tokens: a list of ``len(prompt) + num_tokens`` ints.

    Raises:
        TypeError: if ``model`` has no ``prefill``/``step`` (e.g. a
            :class:`~spe.checkpoint.LoadedCheckpoint`: pass its ``.model``).
        ValueError: if ``num_tokens`` is negative or not an int, a prompt id is not an int
            in [0, V), or as :func:`check_sampling`, before any token is computed.
    """
    check_sampling(top_p=top_p, temperature=temperature)
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise ValueError(f"num_tokens must be an integer ≥ 0, got {num_tokens!r}")
    if not (callable(getattr(model, "prefill", None)) and callable(getattr(model, "step", None))):
        hint = ": pass its .model" if hasattr(model, "model") else ""
        raise TypeError(f"generate needs a decoder language model (with prefill and step), got "
                        f"{type(model).__name__}{hint}")
    vocab = model.config.vocab_size
    bad = [t for t in prompt
           if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < vocab]
    if bad:
        raise ValueError(f"prompt ids must be integers in [0, {vocab}), got {_short_list(bad)}")
    model.eval()
    device = next(model.parameters()).device
    seq = [int(t) for t in prompt]
    state, logits = None, torch.zeros(model.config.vocab_size)  # no prompt: the grammar picks
    if seq:
        logits, state = model.prefill(torch.tensor([seq], device=device))
        logits = logits[0, -1]
    steps = range(num_tokens)
    if progress:
        from tqdm import tqdm

        steps = tqdm(steps, desc="generate", unit="token")
    for i in steps:
        allowed = allowed_next(seq) if allowed_next is not None else None
        seq.append(sample_next(logits, top_p=top_p, temperature=temperature, allowed=allowed,
                               generator=generator))
        if i + 1 < num_tokens:
            logits, state = model.step(torch.tensor([seq[-1]], device=device), state)
            logits = logits[0]
    return seq


def _short_list(values: list) -> str:
    return repr(values[:5])[:-1] + (", ...]" if len(values) > 5 else "]")
