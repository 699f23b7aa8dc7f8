"""Training batches: random crops of tokenised pieces with transposition augmentation.

Letters: B = batch_size, L = sequence length (tokens).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["CropSampler", "PitchShifter", "prefix_batch"]


class PitchShifter:
    """Transposes REMI token sequences by whole semitones, staying inside the pitch range.

    Only ``Pitch_<n>`` tokens move (drum pitches and every other token stay).

    Args:
        vocab: token string -> id (the tokenizer's ``vocab``).
        max_shift: largest transposition in semitones (appendix C.1 uses ±6).
    """

    def __init__(self, vocab: dict[str, int], max_shift: int = 6) -> None:
        self.max_shift = max_shift
        size = max(vocab.values()) + 1
        self.pitch_of = np.full(size, -1, dtype=np.int64)
        self.id_of = np.full(128, -1, dtype=np.int64)
        for token, idx in vocab.items():
            kind, _, value = token.partition("_")
            if kind == "Pitch":
                self.pitch_of[idx] = int(value)
                self.id_of[int(value)] = idx
        present = np.flatnonzero(self.id_of >= 0)
        self.low, self.high = (int(present.min()), int(present.max())) if present.size else (0, -1)

    def shift_range(self, ids: np.ndarray) -> tuple[int, int]:
        """Smallest and largest shift keeping every pitch of ``ids`` in the vocabulary."""
        pitches = self.pitch_of[ids]
        pitches = pitches[pitches >= 0]
        if pitches.size == 0:
            return 0, 0
        return max(-self.max_shift, self.low - int(pitches.min())), min(self.max_shift, self.high - int(pitches.max()))

    def __call__(self, ids: np.ndarray, shift: int) -> np.ndarray:
        """Returns ``ids`` transposed by ``shift`` semitones (must lie in :meth:`shift_range`)."""
        if shift == 0:
            return ids
        out = ids.copy()
        mask = self.pitch_of[ids] >= 0
        out[mask] = self.id_of[self.pitch_of[ids[mask]] + shift]
        if (out[mask] < 0).any():
            raise ValueError(f"shift {shift} moves a pitch outside the vocabulary")
        return out


class CropSampler:
    """Random training crops of ``length + 1`` tokens (inputs and next-token targets).

    A piece is chosen with probability proportional to its number of possible crops, so every
    crop position in the corpus is equally likely; each crop gets a random transposition.

    Args:
        pieces: token id arrays.
        length: L, the training length.
        shifter: transposition, or None for none.

    Raises:
        ValueError: if no piece is longer than ``length``.
    """

    def __init__(self, pieces: list[np.ndarray], length: int, shifter: PitchShifter | None = None) -> None:
        self.pieces = [p for p in pieces if len(p) > length]
        if not self.pieces:
            longest = max((len(p) for p in pieces), default=0)
            raise ValueError(f"no training piece is longer than the training length {length} tokens "
                             f"(longest: {longest}); lower --seq-len")
        self.length, self.shifter = length, shifter
        starts = np.array([len(p) - length for p in self.pieces], dtype=np.float64)
        self.weights = torch.from_numpy(starts / starts.sum())

    def sample(self, batch_size: int, generator: torch.Generator) -> Tensor:
        """Returns (B, L + 1) int64 token ids."""
        which = torch.multinomial(self.weights, batch_size, replacement=True, generator=generator)
        rows = []
        for i in which.tolist():
            piece = self.pieces[i]
            start = int(torch.randint(0, len(piece) - self.length, (1,), generator=generator))
            crop = piece[start:start + self.length + 1]
            if self.shifter is not None:
                lo, hi = self.shifter.shift_range(crop)
                crop = self.shifter(crop, int(torch.randint(lo, hi + 1, (1,), generator=generator)))
            rows.append(torch.from_numpy(np.ascontiguousarray(crop)))
        return torch.stack(rows)


def prefix_batch(pieces: list[np.ndarray], length: int) -> Tensor:
    """The first ``length`` tokens of every piece at least that long, (N, length) int64."""
    rows = [torch.from_numpy(np.ascontiguousarray(p[:length])) for p in pieces if len(p) >= length]
    if not rows:
        return torch.zeros(0, length, dtype=torch.long)
    return torch.stack(rows).long()
