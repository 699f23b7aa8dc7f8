"""The synthetic tasks' data: flip-flop language modelling and multi-query associative recall.

Each example is a pair of (T,) int64 tensors ``tokens`` and ``targets``: the model reads
``tokens`` and its logits at position t are scored against ``targets[t]`` (the next token
where a loss is taken, ``IGNORE`` = −100 elsewhere, as :func:`torch.nn.functional.cross_entropy`
ignores). Everything is drawn from an explicit ``torch.Generator``, so a split is a pure
function of its seed. Letters: B = batch, T = length in tokens, P = T / 2 instruction–bit
pairs, N = key–value pairs.

* **Flip-flop** (Liu et al., NeurIPS 2023, "Exposing attention glitches with flip-flop language
  modeling"): P pairs (instruction, bit), instruction w (write), r (read) or i (ignore),
  drawn i.i.d. with p(i) = ``p_ignore`` and p(w) = p(r) = (1 − p(i)) / 2, except that the first
  is always w (every read has a write before it) and the last always r (every sequence has a
  read). Bits of w and i are uniform; the bit after an r is the last written bit. The loss is
  taken only there: ``targets`` holds that bit at the position of each r.
* **MQAR** (Arora et al. 2023, "Zoology"): N key–value pairs k₁ v₁ … k_N v_N (N distinct keys
  from ``num_keys`` key tokens, values uniform over ``num_values`` value tokens: disjoint
  vocabularies), then a query region of T − 2N tokens cut into (T − 2N) / 2 two-token slots; N
  of them, chosen uniformly without replacement, hold the queries k v (every key queried once,
  in a uniformly random order) and the others the filler pair · ·. The loss is taken at each
  query key, whose target is its bound value. The number of pairs at length T is
  :func:`mqar_pairs`: N_L at the training length L, growing as √(T / L), so longer tests have
  both more pairs and longer gaps between a pair and its query.
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import Tensor

__all__ = ["FLIP_FLOP_DISTRIBUTIONS", "IGNORE", "MQAR_DISTRIBUTIONS", "TASKS", "check_length", "flip_flop",
           "mqar", "mqar_pairs", "split_seed", "vocabulary"]

IGNORE = -100  # targets where no loss is taken (cross_entropy's ignore_index)
TASKS = ("flip-flop", "mqar")

# Flip-flop tokens: the three instructions, then the two bits.
WRITE, READ, IGNORE_INSTRUCTION, BIT0, BIT1 = range(5)
# Test distributions: p(i) of flip-flop (None: the training p(i)); MQAR's pairs at length T.
FLIP_FLOP_DISTRIBUTIONS = {"in-distribution": None, "sparse": 0.98, "dense": 0.1}
MQAR_DISTRIBUTIONS = ("more-pairs", "same-pairs")
FILLER = 0  # MQAR's filler token; keys follow it, then values


def vocabulary(task: str, *, num_keys: int = 0, num_values: int = 0) -> dict[str, int]:
    """Token name -> id of a task's vocabulary (MQAR: ``filler``, ``k0`` … ``k{K−1}``, ``v0`` …)."""
    if task == "flip-flop":
        return {"w": WRITE, "r": READ, "i": IGNORE_INSTRUCTION, "0": BIT0, "1": BIT1}
    if task == "mqar":
        return {"filler": FILLER, **{f"k{j}": 1 + j for j in range(num_keys)},
                **{f"v{j}": 1 + num_keys + j for j in range(num_values)}}
    raise ValueError(f"unknown synthetic task {task!r}; choose from {', '.join(TASKS)}")


def check_length(task: str, length: int, what: str = "length") -> None:
    """Refuses a sequence length the task's layout cannot take.

    Raises:
        ValueError: naming ``what`` and the value, unless it is an even integer ≥ 4 (flip-flop:
            a write and a read; MQAR: a pair and its query).
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 4 or length % 2:
        raise ValueError(f"{what} must be an even number of tokens ≥ 4 ({task} is made of two-token units), "
                         f"got {length!r}")


def split_seed(*parts: object) -> int:
    """The seed of a fixed split, from its name (e.g. ``("flip-flop", "sparse", 4096, 0)``):
    the first 8 bytes of the SHA-256 of the parts joined by ``/``, as a 63-bit integer, so that
    every (task, distribution, length, eval seed) has its own stream on every platform."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def flip_flop(batch: int, length: int, *, p_ignore: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """B flip-flop sequences of T tokens (see the module docstring).

    Args:
        batch: B.
        length: T, even, ≥ 4.
        p_ignore: p(i) in [0, 1); p(w) = p(r) = (1 − p(i)) / 2.
        generator: the source of every draw.

    Returns:
        ``tokens`` (B, T) and ``targets`` (B, T): the read bit at each r, ``IGNORE`` elsewhere.

    Raises:
        ValueError: on a bad length or p(i).
    """
    check_length("flip-flop", length)
    if not 0.0 <= p_ignore < 1.0:
        raise ValueError(f"p_ignore must be in [0, 1), got {p_ignore!r}")
    pairs = length // 2
    u = torch.rand(batch, pairs, generator=generator)  # (B, P)
    instruction = torch.where(u < p_ignore, IGNORE_INSTRUCTION,
                              torch.where(u < p_ignore + (1.0 - p_ignore) / 2, WRITE, READ))
    instruction[:, 0], instruction[:, -1] = WRITE, READ
    bits = torch.randint(0, 2, (batch, pairs), generator=generator)  # (B, P)
    index = torch.arange(pairs).expand(batch, pairs)
    last_write = torch.where(instruction == WRITE, index, -1).cummax(dim=1).values  # ≥ 0: pair 0 writes
    is_read = instruction == READ
    bits = torch.where(is_read, bits.gather(1, last_write), bits)
    tokens = torch.stack([instruction, BIT0 + bits], dim=-1).reshape(batch, length)  # (B, T)
    targets = torch.full_like(tokens, IGNORE)
    targets[:, 0::2] = torch.where(is_read, BIT0 + bits, IGNORE)  # at r, the bit that follows
    return tokens, targets


def mqar_pairs(length: int, train_length: int, train_pairs: int, num_keys: int) -> int:
    """N at length T: round(N_L · √(T / L)), at least 1, at most T / 4 (room for every query)
    and ``num_keys`` (keys are distinct)."""
    return max(1, min(num_keys, length // 4, round(train_pairs * math.sqrt(length / train_length))))


def mqar(batch: int, length: int, *, num_pairs: int, num_keys: int, num_values: int,
         generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """B MQAR sequences of T tokens with N pairs each (see the module docstring).

    Args:
        batch: B.
        length: T, even, ≥ 4N.
        num_pairs: N ≥ 1, at most ``num_keys``.
        num_keys, num_values: sizes of the key and value vocabularies.
        generator: the source of every draw.

    Returns:
        ``tokens`` (B, T) and ``targets`` (B, T): the bound value at each query key, ``IGNORE`` elsewhere.

    Raises:
        ValueError: on a bad length, or N that does not fit the length or the keys.
    """
    check_length("mqar", length)
    if not 1 <= num_pairs <= min(num_keys, length // 4):
        raise ValueError(f"num_pairs must be in [1, min(num_keys {num_keys}, length / 4 = {length // 4})], "
                         f"got {num_pairs!r}")
    if num_values < 1:
        raise ValueError(f"num_values must be positive, got {num_values!r}")
    n, rows = num_pairs, torch.arange(batch)[:, None]
    keys = 1 + torch.rand(batch, num_keys, generator=generator).argsort(dim=1)[:, :n]  # (B, N) distinct
    values = 1 + num_keys + torch.randint(0, num_values, (batch, n), generator=generator)  # (B, N)
    order = torch.rand(batch, n, generator=generator).argsort(dim=1)  # (B, N) query order
    slots = (length - 2 * n) // 2
    chosen = torch.rand(batch, slots, generator=generator).argsort(dim=1)[:, :n].sort(dim=1).values  # (B, N)
    at = 2 * n + 2 * chosen  # (B, N) positions of the query keys
    tokens = torch.full((batch, length), FILLER, dtype=torch.long)
    tokens[:, 0:2 * n:2], tokens[:, 1:2 * n:2] = keys, values
    tokens[rows, at], tokens[rows, at + 1] = keys.gather(1, order), values.gather(1, order)
    targets = torch.full_like(tokens, IGNORE)
    targets[rows, at] = values.gather(1, order)
    return tokens, targets
