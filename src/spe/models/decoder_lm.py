"""Decoder-only language model with absolute or stochastic positional encoding.

Letters: B = batch, L = length, C = d_model, V = vocab_size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spe.attention.layer import MultiHeadAttention
from spe.encodings.absolute import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from spe.encodings.alibi import ALiBi
from spe.encodings.code import SPECode
from spe.encodings.conv import ConvSPE
from spe.encodings.filter import SPEFilter
from spe.encodings.music_relative import MusicRelativePosition
from spe.encodings.rope import RotaryEncoding
from spe.encodings.shaw import ShawRelativePosition
from spe.encodings.sine import SineSPE
from spe.models.config import SCORE_ENCODINGS, ModelConfig

__all__ = ["Block", "DecoderLM", "DecodingState"]


@dataclass
class DecodingState:
    """Explicit state of recurrent decoding.

    Attributes:
        position: index of the next position to be fed.
        layers: per-layer attention state (linear kernels: ``{"s": (B, H, M, D + 1)}``;
            softmax: the cached keys and values).
    """

    position: int
    layers: list[dict]


class Block(nn.Module):
    """Pre-norm Transformer block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        spe = config.positional in ("sinespe", "convspe")
        head_dim = config.d_model // config.num_heads
        spe_filter = (SPEFilter(config.num_heads, head_dim, gated=config.gated, gate_init=config.gate_init)
                      if spe else None)
        rotary = RotaryEncoding(config.rope_base) if config.positional == "rope" else None
        score_encoding = {
            "shaw": lambda: ShawRelativePosition(head_dim, config.max_distance),
            "music-relative": lambda: MusicRelativePosition(config.num_heads, head_dim, config.max_distance),
            "alibi": lambda: ALiBi(config.num_heads),
        }.get(config.positional, lambda: None)()
        self.norm1 = nn.LayerNorm(config.d_model)
        self.attn = MultiHeadAttention(
            config.d_model, config.num_heads, attention=config.attention, causal=True,
            spe_filter=spe_filter, num_realizations=config.num_realizations if spe else None,
            num_features=config.num_features, chunk_size=config.chunk_size, rotary=rotary,
            score_encoding=score_encoding, window=config.attention_window)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.ffn = nn.Sequential(nn.Linear(config.d_model, config.d_ff), nn.GELU(),
                                 nn.Linear(config.d_ff, config.d_model))
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, code: SPECode | None, positions: Tensor | None = None) -> Tensor:
        x = x + self.drop(self.attn(self.norm1(x), code, positions=positions))
        return x + self.drop(self.ffn(self.norm2(x)))

    def step(self, x: Tensor, code: SPECode | None, state: dict | None) -> tuple[Tensor, dict]:
        y, state = self.attn.step(self.norm1(x), code, state)
        x = x + y
        return x + self.ffn(self.norm2(x)), state


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
        head_dim = config.d_model // config.num_heads
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        # Token embeddings start at std 0.02 (good tied output logits); with APE, √C brings them
        # to the scale of the unit-amplitude sinusoidal encoding they are added to (Vaswani et
        # al.). Without an additive encoding there is nothing to balance: on the Bach demo the
        # unscaled embedding trained SPE models better (validation 1.13 vs 1.28 nats at ~300 steps).
        self.embed_scale = config.d_model ** 0.5 if config.positional == "ape" else 1.0
        self.ape: nn.Module | None = None
        if config.positional == "ape":
            self.ape = SinusoidalPositionalEncoding(config.d_model)
        elif config.positional == "ape-learned":
            self.ape = LearnedPositionalEmbedding(config.max_positions, config.d_model)
        def make_encoding() -> nn.Module | None:
            if config.positional == "sinespe":
                return SineSPE(config.num_heads, head_dim, config.num_realizations, config.num_sines,
                               frequency_init=config.frequency_init, noise=config.code_noise)
            if config.positional == "convspe":
                return ConvSPE(config.num_heads, head_dim, config.num_realizations, config.kernel_size)
            return None

        # The first layer's encoding (the only one when shared) keeps the name ``encoding`` so
        # that checkpoints of shared models load unchanged.
        self.encoding: nn.Module | None = make_encoding()
        self.layer_encodings: nn.ModuleList | None = None
        if self.encoding is not None and not config.share_across_layers:
            self.layer_encodings = nn.ModuleList(make_encoding() for _ in range(config.num_layers - 1))
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

    def draw_code(self, positions: Tensor, *, generator: torch.Generator | None = None,
                  num_realizations: int | None = None) -> SPECode | None:
        """Draws the first block's SPE code for (L,) positions (the shared one; None without SPE)."""
        return self.draw_codes(positions, generator=generator, num_realizations=num_realizations)[0]

    def set_attention_window(self, window: int | None) -> None:
        """Sets every layer's sliding attention window W (None: the whole past), e.g. at test
        time to the training length, and records it in ``config.attention_window``.

        Raises:
            ValueError: if W is not a positive integer or the model has a score encoding.
        """
        if window is not None and self.config.positional in SCORE_ENCODINGS:
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
        if positions is not None and self.config.positional in SCORE_ENCODINGS:
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
        rotary_positions = positions if self.config.positional == "rope" else None  # others need none here
        for block, code in zip(self.blocks, codes):
            x = block(x, code, rotary_positions)
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
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
