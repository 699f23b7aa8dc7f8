"""Decoder-only language model with absolute or stochastic positional encoding.

Letters: B = batch, L = length, C = d_model, V = vocab_size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from spe.encodings.code import SPECode
from spe.encodings.registry import positional_spec
from spe.models.block import Block
from spe.models.config import ModelConfig
from spe.models.loss import cross_entropy
from spe.models.positional import positional_modules
from spe.ops.state import AttentionState

__all__ = ["Block", "DecoderLM", "DecodingState"]


@dataclass
class DecodingState:
    """Explicit state of recurrent decoding (:meth:`DecoderLM.step`).

    Attributes:
        position: index of the next position to be fed.
        layers: one attention state per block: a :class:`~spe.ops.LinearAttentionState` for
            linear kernels (running sums S (B, H, M, D) and z (B, H, M), or the last W keys'
            features and values with a window), a :class:`~spe.ops.KVCache` for softmax (the
            keys and values seen, the last W with a window).
    """

    position: int
    layers: list[AttentionState]


class DecoderLM(nn.Module):
    """Autoregressive language model over token ids.

    One SPE code is drawn per forward pass and shared by all layers and all examples of the
    batch; each layer has its own gate (appendix A.2 of Liutkus et al. 2021). With
    ``share_across_layers=False`` every layer has its own encoding and code instead. In training mode
    the code comes from the ``generator`` passed to :meth:`forward` (or PyTorch's default
    generator); in eval mode from a generator seeded with ``config.code_seed``, so the same
    checkpoint and input give the same logits, and a prefix gets the same code whatever
    length follows it.

    Args:
        config: the model configuration.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        spec = positional_spec(config.positional)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        # Token embeddings start at std 0.02 (good tied output logits); with APE, √C brings them
        # to the scale of the unit-amplitude sinusoidal encoding they are added to (Vaswani et
        # al.). Without an additive encoding there is nothing to balance: on the Bach demo the
        # unscaled embedding trained SPE models better (validation 1.13 vs 1.28 nats at ~300 steps).
        pe = positional_modules(config, spec)
        self.embed_scale = pe.embed_scale
        self.ape: nn.Module | None = pe.ape
        # The first layer's encoding (the only one when shared) keeps the name ``encoding`` so
        # that checkpoints of shared models load unchanged.
        self.encoding: nn.Module | None = pe.encoding
        self.layer_encodings: nn.ModuleList | None = pe.layer_encodings
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def layer_encoding(self, layer: int) -> nn.Module | None:
        """The SPE module (``SineSPE``/``ConvSPE``) of block ``layer`` (0-based; None without SPE)."""
        if self.layer_encodings is None or layer == 0:
            return self.encoding
        return self.layer_encodings[layer - 1]

    def draw_codes(self, positions: Tensor, *, generator: torch.Generator | None = None,
                   num_realizations: int | None = None) -> list[SPECode | None]:
        """Draws the SPE code of every block for (L,) positions.

        Shared encodings draw once and give every block the same code; per-layer encodings
        draw in block order from the same generator. The noise does not depend on the length,
        so a prefix gets the same codes whatever follows it (needed by :meth:`step`).

        Returns:
            num_layers codes (all None without SPE).
        """
        if self.encoding is None:
            return [None] * len(self.blocks)
        if generator is None and not self.training:
            generator = torch.Generator().manual_seed(self.config.code_seed)
        if self.layer_encodings is None:
            code = self.encoding(positions=positions, generator=generator, num_realizations=num_realizations)
            return [code] * len(self.blocks)
        return [self.layer_encoding(i)(positions=positions, generator=generator, num_realizations=num_realizations)
                for i in range(len(self.blocks))]

    def set_attention_window(self, window: int | None) -> None:
        """Sets every layer's sliding attention window W (None: the whole past), e.g. at test
        time to the training length, and records it in ``config.attention_window``.

        Raises:
            ValueError: if W is not a positive integer or the model has a score encoding.
        """
        if window is not None and positional_spec(self.config.positional).acts_on == "scores":
            raise ValueError(f"an attention window cannot be combined with positional {self.config.positional!r}")
        for block in self.blocks:
            block.attn.window = window
        self.config.attention_window = window

    @torch.no_grad()
    def redraw_features(self, generator: torch.Generator | None = None) -> None:
        """Redraws every layer's FAVOR+ random features (no-op for other kernels)."""
        for block in self.blocks:
            block.attn.redraw_features(generator)

    def forward(self, tokens: Tensor, *, positions: Tensor | None = None,
                generator: torch.Generator | None = None, num_realizations: int | None = None) -> Tensor:
        """Args:
            tokens: (B, L) token ids in [0, V).
            positions: (L,) positions shared by the batch (default 0 … L−1). With ``sinespe``
                and ``rope`` they may be real-valued, e.g. onset times in beats (continuous
                positions); ``convspe`` and ``ape-learned`` need integers; the score encodings
                (``shaw``, ``music-relative``, ``alibi``) use index distances and take none.
            generator: source of the SPE code in training mode.
            num_realizations: R for this pass (default: the config's), e.g. a test-time R.

        Returns:
            (B, L, V) logits of the next token at each position.

        Raises:
            ValueError: on a tensor that is not (batch, length), ids out of range, positions
                with a score encoding, or ``ape-learned`` positions beyond ``max_positions``.
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, length), got shape {tuple(tokens.shape)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.config.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size}), got "
                             f"[{int(tokens.min())}, {int(tokens.max())}]")
        n = tokens.shape[1]
        scores = positional_spec(self.config.positional).acts_on == "scores"
        if positions is not None and scores:
            raise ValueError(f"positional {self.config.positional!r} works on index distances; it takes no positions")
        if positions is None:
            positions = torch.arange(n, device=tokens.device)
        elif positions.shape != (n,):
            raise ValueError(f"positions must have shape ({n},) like the tokens' length, got {tuple(positions.shape)}")
        x = self.embed(tokens) * self.embed_scale  # (B, L, C)
        if self.ape is not None:
            x = self.ape(x, positions)
        x = self.drop(x)
        codes = self.draw_codes(positions, generator=generator, num_realizations=num_realizations)
        for block, code in zip(self.blocks, codes):  # score encodings use index distances, take none
            x = block(x, code, None if scores else positions)
        return self.head(self.norm(x))

    @torch.no_grad()
    def step(self, tokens: Tensor, state: DecodingState | None = None) -> tuple[Tensor, DecodingState]:
        """Recurrent decoding: logits for the next position, given one new token per sequence.

        In eval mode, ``model(tokens)`` and successive ``step`` calls from a fresh state use the
        same positional code (the noise comes from ``config.code_seed`` and does not depend on
        the length), so their logits agree. Linear-attention layers keep a fixed-size state,
        so each token costs the same time and memory whatever its position.

        Args:
            tokens: (B,) token ids at position ``state.position`` (0 for a fresh state).
            state: from the previous call, or None to start.

        Returns:
            (B, V) logits and the new state.
        """
        if tokens.dim() != 1:
            raise ValueError(f"step takes one token per sequence, shape (batch,), got {tuple(tokens.shape)}")
        position = 0 if state is None else state.position
        x = self.embed(tokens[:, None]) * self.embed_scale  # (B, 1, C)
        pos = torch.tensor([position], device=tokens.device)
        if self.ape is not None:
            x = self.ape(x, pos)
        codes = self.draw_codes(pos, generator=torch.Generator().manual_seed(self.config.code_seed))
        layers = []
        for i, (block, code) in enumerate(zip(self.blocks, codes)):
            x, layer_state = block.step(x, code, None if state is None else state.layers[i])
            layers.append(layer_state)
        return self.head(self.norm(x))[:, 0], DecodingState(position=position + 1, layers=layers)

    def loss(self, tokens: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        """Mean next-token cross-entropy (nats) of (B, L) tokens, predicting tokens[:, 1:]."""
        logits = self(tokens[:, :-1], generator=generator)
        return cross_entropy(logits, tokens[:, 1:])
