"""REMI grammar for sampling: which token may follow which.

Uses MidiTok's own token-type graph (``tokenizer.tokens_types_graph``; with tracks kept apart,
:func:`spe.lab.music.corpus.make_tokenizer`'s graph lets a ``Track`` token follow ``Program``) and
adds one rule it checks only when decoding: inside a bar, ``Position`` tokens must increase. Special tokens
(PAD, BOS, EOS, MASK) are never sampled.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["REMIGrammar"]

_SPECIAL = ("PAD", "BOS", "EOS", "MASK")


class REMIGrammar:
    """Masks of allowed next tokens for a REMI tokenizer.

    Args:
        tokenizer: a MidiTok REMI tokenizer.
    """

    def __init__(self, tokenizer) -> None:
        vocab: dict[str, int] = tokenizer.vocab
        size = max(vocab.values()) + 1
        kinds = sorted({t.split("_")[0] for t in vocab})
        self._kind_index = {k: i for i, k in enumerate(kinds)}
        self.kind_of = torch.zeros(size, dtype=torch.long)
        self.position_of = torch.full((size,), -1, dtype=torch.long)
        for token, idx in vocab.items():
            kind, _, value = token.partition("_")
            self.kind_of[idx] = self._kind_index[kind]
            if kind == "Position":
                self.position_of[idx] = int(value)
        graph = tokenizer.tokens_types_graph
        allowed_kinds = torch.zeros(len(kinds), len(kinds), dtype=torch.bool)
        for prev, nexts in graph.items():
            if prev not in self._kind_index:
                continue
            for nxt in nexts:
                nxt = nxt.split("_")[0]
                if nxt in self._kind_index and nxt not in _SPECIAL:
                    allowed_kinds[self._kind_index[prev], self._kind_index[nxt]] = True
        self.allowed = allowed_kinds[:, self.kind_of]  # (kinds, V)
        self.first = torch.zeros(size, dtype=torch.bool)
        self.first[[idx for t, idx in vocab.items() if t.startswith("Bar")]] = True
        self.bar_kind = self._kind_index.get("Bar", -1)
        self.position_kind = self._kind_index.get("Position", -1)

    def allowed_next(self, prefix: list[int]) -> Tensor:
        """Boolean (V,) mask of tokens that may follow ``prefix`` (a list of ids)."""
        if not prefix:
            return self.first.clone()
        mask = self.allowed[int(self.kind_of[prefix[-1]])].clone()
        last_position = -1
        for idx in reversed(prefix):
            kind = int(self.kind_of[idx])
            if kind == self.bar_kind:
                break
            if kind == self.position_kind:
                last_position = int(self.position_of[idx])
                break
        if last_position >= 0:
            mask &= ~((self.position_of >= 0) & (self.position_of <= last_position))
        if not mask.any():  # a dead end the graph does not foresee: let a new bar start
            mask = self.first.clone()
        return mask
