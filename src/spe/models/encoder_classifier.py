"""Encoder classifier for the Long Range Arena: bidirectional blocks, pooling, an MLP head.

Letters: B = batch, L = length (with the CLS token), C = d_model, K = num_classes,
Y × X = image grid.

    x = embed(tokens) (+ APE) → N × Block(causal=False) → LayerNorm → pool → MLP → logits

Padding never reaches a real position: every block gets a key padding mask built from the
sequence lengths (never from the token ids), and mean pooling averages real positions only.
For pairs (Retrieval) one encoder reads both documents in one batch (two towers with shared
weights) and the head classifies LRA's interaction features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spe.models.classifier_config import ClassifierConfig
from spe.models.trunk import Trunk, check_in_range

__all__ = ["EncoderClassifier", "interaction_features"]

# Input width of the MLP head, in units of C, per two-tower interaction.
_WIDTH = {None: 1, "concat": 2, "nli": 4}


def interaction_features(u: Tensor, v: Tensor, interaction: str) -> Tensor:
    """The two-tower head's input: ``nli`` → [u, v, u·v, u − v] (B, 4C) (LRA's NLI
    interaction, u·v elementwise), ``concat`` → [u, v] (B, 2C); u, v (B, C)."""
    if interaction == "nli":
        return torch.cat([u, v, u * v, u - v], dim=-1)
    if interaction == "concat":
        return torch.cat([u, v], dim=-1)
    raise ValueError(f"interaction must be 'nli' or 'concat', got {interaction!r}")


class EncoderClassifier(Trunk):
    """Sequence (or sequence-pair) classifier over token ids.

    The trunk (:class:`~spe.models.trunk.Trunk`) with bidirectional blocks, pooling and an MLP
    head. The positional encoding comes from the registry (:mod:`spe.encodings.registry`):
    added to tokens (``ape``, ``ape-learned``), a code on queries and keys (``sinespe``,
    ``convspe``, ``convspe-2d``), a rotation (``rope``) or ``none``. Codes are drawn as the
    trunk says (in eval mode from ``config.code_seed``, so a checkpoint gives the same
    predictions twice).

    With ``pooling="cls"`` the CLS token is prepended at position 0. ``convspe-2d`` encodes
    the 2-D offset between pixels of the ``config.grid``; the CLS token has no place on the
    grid, so its code row is zero: with gating its q̂, k̂ keep only the position-free part
    √δ_d ε_d (it attends to pixels by content, through the kernel's constant δ_d); ungated it
    attends uniformly, i.e. it reads the mean of the pixels' values.

    Args:
        config: a :class:`~spe.models.ClassifierConfig`.

    Raises:
        TypeError: if ``config`` is not a :class:`~spe.models.ClassifierConfig`.
    """

    MODEL_KIND = "encoder-classifier"

    def __init__(self, config: ClassifierConfig) -> None:
        if not isinstance(config, ClassifierConfig):
            raise TypeError(f"config must be a ClassifierConfig, got {type(config).__name__}")
        super().__init__(config, causal=False, grid=config.grid, prefix=int(config.pooling == "cls"))

    def build_head(self) -> nn.Module:
        config = self.config
        hidden = config.head_hidden or config.d_ff
        return nn.Sequential(nn.Linear(config.d_model * _WIDTH[config.interaction], hidden), nn.GELU(),
                             nn.Linear(hidden, config.num_classes))

    def _check(self, tokens: Tensor, lengths: Tensor | None) -> Tensor:
        """Checks (B, L) tokens and returns their (B,) lengths as int64 (default: L)."""
        self.check_tokens(tokens)
        b, n = tokens.shape
        if lengths is None:
            return torch.full((b,), n, dtype=torch.long, device=tokens.device)
        lengths = torch.as_tensor(lengths, device=tokens.device)

        def describe(lo: int, hi: int) -> str:
            return f"lengths must be ({b},) integers in [1, {n}], got {lengths.tolist()}"

        if lengths.shape != (b,):
            raise ValueError(describe(0, 0))
        check_in_range(lengths, 1, n, describe)
        return lengths.long()

    def _pool(self, tokens: Tensor, lengths: Tensor, generator: torch.Generator | None,
              num_realizations: int | None) -> Tensor:
        """(B, L) checked tokens and (B,) lengths → (B, C) pooled encodings."""
        if self.config.pooling == "cls":
            cls = torch.full_like(tokens[:, :1], self.config.cls_id)
            tokens, lengths = torch.cat([cls, tokens], dim=1), lengths + 1
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        padding = positions[None, :] >= lengths[:, None]  # (B, L), True at padding
        x = self.hidden(tokens, positions, key_padding_mask=padding, generator=generator,
                        num_realizations=num_realizations)
        if self.config.pooling == "cls":
            return x[:, 0]
        keep = (~padding)[..., None].to(x.dtype)
        return (x * keep).sum(1) / lengths[:, None].to(x.dtype)

    def encode(self, tokens: Tensor, lengths: Tensor | None = None, *, generator: torch.Generator | None = None,
               num_realizations: int | None = None) -> Tensor:
        """Pooled encodings of a batch of sequences.

        Args:
            tokens: (B, L) ids, right-padded; what lies beyond a sequence's length is ignored.
            lengths: (B,) real tokens per sequence, in [1, L] (default: L for all).
            generator: source of the SPE code in training mode.
            num_realizations: R for this pass (default: the config's).

        Returns:
            (B, C): the final-norm output at CLS, or the mean over real positions.

        Raises:
            ValueError: on a tensor that is not (batch, length), ids out of range, bad
                lengths (on CUDA both are device-side assertions, see
                :func:`~spe.models.trunk.check_in_range`), a grid length mismatch
                (``convspe-2d``) or positions beyond ``max_positions`` (``ape-learned``).
        """
        return self._pool(tokens, self._check(tokens, lengths), generator, num_realizations)

    def forward(self, tokens: Tensor, lengths: Tensor | None = None, tokens2: Tensor | None = None,
                lengths2: Tensor | None = None, *, generator: torch.Generator | None = None,
                num_realizations: int | None = None) -> Tensor:
        """Class logits.

        Args:
            tokens, lengths: (B, L) ids and (B,) lengths (see :meth:`encode`).
            tokens2, lengths2: the second documents (B, L2), (B,), required with a two-tower
                ``interaction`` and refused without one. Both documents are encoded in one
                batch of 2B (padded to max(L, L2); the padding is masked).
            generator, num_realizations: as :meth:`encode`.

        Returns:
            (B, K) logits.

        Raises:
            ValueError: as :meth:`encode`; for a second document without a two-tower
                interaction or none with one, or documents of different batch sizes.
        """
        pair = self.config.interaction is not None
        if pair != (tokens2 is not None):
            raise ValueError("this classifier takes pairs of documents (tokens2)" if pair
                             else "tokens2 given, but the classifier has no two-tower interaction")
        if not pair:
            return self.head(self.encode(tokens, lengths, generator=generator, num_realizations=num_realizations))
        lengths, lengths2 = self._check(tokens, lengths), self._check(tokens2, lengths2)
        if tokens2.shape[0] != tokens.shape[0]:
            raise ValueError(f"both documents need the same batch size, got {tokens.shape[0]} and {tokens2.shape[0]}")
        n = max(tokens.shape[1], tokens2.shape[1])
        both = torch.cat([F.pad(tokens, (0, n - tokens.shape[1])), F.pad(tokens2, (0, n - tokens2.shape[1]))])
        u, v = self._pool(both, torch.cat([lengths, lengths2]), generator, num_realizations).chunk(2)
        return self.head(interaction_features(u, v, self.config.interaction))
