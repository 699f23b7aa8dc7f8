"""Table 7's protocol: where identical-token probes are scored, with which tokens, and T/M per head.

Liutkus et al. (2021), appendix D.3: translation invariance T and monotonicity M of the first
layer's unnormalised attention on a sequence repeating one token. Letters: H = heads,
L = training length.
"""

from __future__ import annotations

import numpy as np

from spe.lab.metrics.pe_properties import monotonicity, translation_invariance
from spe.lab.metrics.probing import identical_token_attention

__all__ = ["pe_metrics", "probe_plan", "probe_tokens"]


def probe_plan(seq_len: int) -> dict:
    """Where identical-token probes are scored for a model trained on ``seq_len`` tokens.

    Table 7 trains on 2048 tokens and scores queries in (0, 1024], (1024, 2048] and
    (2048, 2560] with offsets < 128, 512, 1024. Scaled to any training length L we take:

    * probe length L + min(L, 512) (2560 for L = 2048, as the paper);
    * query rows [0, L) (trained positions) and [L, L + min(L, 512)) (extrapolation);
    * offsets < min(64, L) (local) and < min(L, 512) (long range), deduplicated.

    The 512 caps keep monotonicity (O(rows · offsets²) comparisons per head) and the
    (H, length, length) float64 probe affordable for long training lengths.

    Args:
        seq_len: training length L in tokens, >= 2.

    Returns:
        ``{"length": int, "ranges": [(start, stop), ...], "offsets": [max_offset, ...]}``,
        0-based half-open query ranges and largest offsets m − n considered.

    Raises:
        ValueError: if ``seq_len`` < 2 (no two keys to compare).
    """
    if seq_len < 2:
        raise ValueError(f"probing needs a training length of at least 2 tokens, got {seq_len}")
    extra = min(seq_len, 512)
    offsets = sorted({min(64, seq_len), extra})
    return {"length": seq_len + extra, "ranges": [(0, seq_len), (seq_len, seq_len + extra)],
            "offsets": [o - 1 for o in offsets]}


def probe_tokens(vocab_size: int, count: int) -> list[int]:
    """``count`` token ids evenly spaced over [0, vocab_size) (all of them if count >= vocab_size).

    Raises:
        ValueError: if ``count`` < 1.
    """
    if count < 1:
        raise ValueError(f"the number of probe tokens must be at least 1, got {count}")
    return sorted(set(np.rint(np.linspace(0, vocab_size - 1, min(count, vocab_size))).astype(int).tolist()))


def pe_metrics(model, *, seq_len: int, tokens: list[int], progress: bool = False) -> dict:
    """Translation invariance T and monotonicity M of the first layer (appendix D.3, Table 7).

    For each token of ``tokens``, :func:`~spe.lab.metrics.identical_token_attention` gives the
    unnormalised attention of layer 0 on that token repeated ``probe_plan(seq_len)["length"]``
    times; T and M are computed per head for every (query range, offset) pair of
    :func:`probe_plan`, averaged over the tokens, and the best (lowest) head is reported, as in
    Table 7 (T and M may come from different heads).

    Args:
        model: a DecoderLM (score encodings are refused by the probe).
        seq_len: the model's training length in tokens.
        tokens: token ids to probe.
        progress: show a progress bar over tokens.

    Returns:
        ``{"length", "tokens", "columns": [{"query_range", "max_offset", "T": {"best", "head",
        "per_head"}, "M": {...}}]}``; heads are 0-based.

    Raises:
        ValueError: from the probe (score encodings, RoPE with a linear kernel).
    """
    plan = probe_plan(seq_len)
    cells = [(r, o) for r in plan["ranges"] for o in plan["offsets"]]
    num_heads = model.config.num_heads
    metrics = {"T": translation_invariance, "M": monotonicity}
    sums = np.zeros((len(cells), len(metrics), num_heads))  # summed over tokens
    loop = tokens
    if progress:
        from tqdm import tqdm

        loop = tqdm(tokens, desc=f"probe {model.config.positional}", unit="token")
    for token in loop:
        attn = identical_token_attention(model, token, plan["length"], layer=0)  # (H, L, L)
        for c, (query_range, max_offset) in enumerate(cells):
            for m, metric in enumerate(metrics.values()):
                for h in range(num_heads):
                    sums[c, m, h] += metric(attn[h], query_range=query_range, max_offset=max_offset)
    columns = []
    for c, (query_range, max_offset) in enumerate(cells):
        column = {"query_range": list(query_range), "max_offset": max_offset}
        for m, name in enumerate(metrics):
            per_head = sums[c, m] / len(tokens)
            column[name] = {"best": float(per_head.min()), "head": int(per_head.argmin()),
                            "per_head": per_head.tolist()}
        columns.append(column)
    return {"length": plan["length"], "tokens": list(tokens), "columns": columns}
