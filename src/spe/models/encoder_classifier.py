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

from spe.encodings.code import DenseCode, SPECode
from spe.encodings.registry import positional_spec
from spe.models.block import Block
from spe.models.classifier_config import ClassifierConfig
from spe.models.decoder_lm import DecoderLM
from spe.models.positional import positional_modules

__all__ = ["EncoderClassifier", "interaction_features"]


def interaction_features(u: Tensor, v: Tensor, interaction: str) -> Tensor:
    """The two-tower head's input: ``nli`` → [u, v, u·v, u − v] (B, 4C) (LRA's NLI
    interaction, u·v elementwise), ``concat`` → [u, v] (B, 2C); u, v (B, C)."""
    if interaction == "nli":
        return torch.cat([u, v, u * v, u - v], dim=-1)
    if interaction == "concat":
        return torch.cat([u, v], dim=-1)
    raise ValueError(f"interaction must be 'nli' or 'concat', got {interaction!r}")


class EncoderClassifier(nn.Module):
    """Sequence (or sequence-pair) classifier over token ids.

    The positional encoding comes from the registry (:mod:`spe.encodings.registry`): added to
    tokens (``ape``, ``ape-learned``), a code on queries and keys (``sinespe``, ``convspe``,
    ``convspe-2d``), a rotation (``rope``) or ``none``. As in :class:`~spe.DecoderLM`, one SPE
    code is drawn per forward pass and shared by every example (and, with
    ``share_across_layers``, every layer; each layer keeps its own gate); in eval mode the
    code comes from ``config.code_seed``, so a checkpoint gives the same predictions twice.

    With ``pooling="cls"`` the CLS token is prepended at position 0. ``convspe-2d`` encodes
    the 2-D offset between pixels of the ``config.grid``; the CLS token has no place on the
    grid, so its code row is zero: with gating its q̂, k̂ keep only the position-free part
    √δ_d ε_d (it attends to pixels by content, through the kernel's constant δ_d); ungated it
    attends uniformly, i.e. it reads the mean of the pixels' values.

    Args:
        config: a :class:`~spe.models.ClassifierConfig`.
    """

    MODEL_KIND = "encoder-classifier"

    def __init__(self, config: ClassifierConfig) -> None:
        super().__init__()
        if not isinstance(config, ClassifierConfig):
            raise TypeError(f"config must be a ClassifierConfig, got {type(config).__name__}")
        self.config = config
        spec = self.spec = positional_spec(config.positional)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        pe = positional_modules(config, spec)
        self.embed_scale = pe.embed_scale
        self.ape: nn.Module | None = pe.ape
        self.encoding: nn.Module | None = pe.encoding
        self.layer_encodings: nn.ModuleList | None = pe.layer_encodings
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, causal=False) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.d_model)
        width = config.d_model * {None: 1, "concat": 2, "nli": 4}[config.interaction]
        hidden = config.head_hidden or config.d_ff
        self.head = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, config.num_classes))
        self.apply(DecoderLM._init_weights)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def draw_codes(self, length: int, *, generator: torch.Generator | None = None,
                   num_realizations: int | None = None) -> list[SPECode | None]:
        """The SPE code of every block for positions 0 … length − 1 (CLS included).

        Returns:
            num_layers codes (all None without SPE); shared encodings give every block the
            same code. The noise does not depend on the length, so a real position's code is
            the same however much padding follows.
        """
        if self.encoding is None:
            return [None] * len(self.blocks)
        if generator is None and not self.training:
            generator = torch.Generator().manual_seed(self.config.code_seed)
        encodings = [self.encoding] + list(self.layer_encodings or [])
        codes = [self._code(e, length, generator, num_realizations) for e in encodings]
        return codes * len(self.blocks) if self.layer_encodings is None else codes

    def _code(self, encoding: nn.Module, length: int, generator, num_realizations) -> SPECode:
        if not self.spec.needs_grid:
            positions = torch.arange(length, device=self.embed.weight.device)
            return encoding(positions=positions, generator=generator, num_realizations=num_realizations)
        extra = int(self.config.pooling == "cls")
        (rows, cols) = self.config.grid
        if length - extra != rows * cols:
            raise ValueError(f"positional {self.config.positional!r} encodes a {rows} × {cols} grid: sequences "
                             f"must hold {rows * cols} tokens, got {length - extra}")
        code = encoding(grid=(rows, cols), generator=generator, num_realizations=num_realizations)
        if not extra:
            return code
        # The CLS token has no grid position: a zero code row (see the class docstring).
        pad = (0, 0, 0, 0, 0, 0, extra, 0)
        return DenseCode(qbar=F.pad(code.qbar, pad), kbar=F.pad(code.kbar, pad), gate_noise=code.gate_noise)

    def _check_tokens(self, tokens: Tensor, lengths: Tensor | None) -> Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, length), got shape {tuple(tokens.shape)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.config.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size}), got "
                             f"[{int(tokens.min())}, {int(tokens.max())}]")
        b, n = tokens.shape
        if lengths is None:
            return torch.full((b,), n, dtype=torch.long, device=tokens.device)
        lengths = torch.as_tensor(lengths, device=tokens.device)
        if lengths.shape != (b,) or (b and (int(lengths.min()) < 1 or int(lengths.max()) > n)):
            raise ValueError(f"lengths must be ({b},) integers in [1, {n}], got {lengths.tolist()}")
        return lengths.long()

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
                lengths, a grid length mismatch (``convspe-2d``) or positions beyond
                ``max_positions`` (``ape-learned``).
        """
        lengths = self._check_tokens(tokens, lengths)
        if self.config.pooling == "cls":
            cls = torch.full_like(tokens[:, :1], self.config.cls_id)
            tokens, lengths = torch.cat([cls, tokens], dim=1), lengths + 1
        n = tokens.shape[1]
        positions = torch.arange(n, device=tokens.device)
        padding = positions[None, :] >= lengths[:, None]  # (B, L), True at padding
        x = self.embed(tokens) * self.embed_scale  # (B, L, C)
        if self.ape is not None:
            x = self.ape(x, positions)
        x = self.drop(x)
        codes = self.draw_codes(n, generator=generator, num_realizations=num_realizations)
        for block, code in zip(self.blocks, codes):
            x = block(x, code, positions, key_padding_mask=padding)
        x = self.norm(x)
        if self.config.pooling == "cls":
            return x[:, 0]
        keep = (~padding)[..., None].to(x.dtype)
        return (x * keep).sum(1) / lengths[:, None].to(x.dtype)

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
        """
        pair = self.config.interaction is not None
        if pair != (tokens2 is not None):
            raise ValueError("this classifier takes pairs of documents (tokens2)" if pair
                             else "tokens2 given, but the classifier has no two-tower interaction")
        if not pair:
            return self.head(self.encode(tokens, lengths, generator=generator, num_realizations=num_realizations))
        lengths = self._check_tokens(tokens, lengths)
        lengths2 = self._check_tokens(tokens2, lengths2)
        if tokens2.shape[0] != tokens.shape[0]:
            raise ValueError(f"both documents need the same batch size, got {tokens.shape[0]} and {tokens2.shape[0]}")
        n = max(tokens.shape[1], tokens2.shape[1])
        both = torch.cat([F.pad(tokens, (0, n - tokens.shape[1])), F.pad(tokens2, (0, n - tokens2.shape[1]))])
        pooled = self.encode(both, torch.cat([lengths, lengths2]), generator=generator,
                             num_realizations=num_realizations)
        u, v = pooled.chunk(2)
        return self.head(interaction_features(u, v, self.config.interaction))
