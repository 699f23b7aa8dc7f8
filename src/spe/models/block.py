"""Pre-norm Transformer block, causal (decoder) or not (encoder).

Letters: B = batch, L = length, C = d_model.
"""

from __future__ import annotations

from torch import Tensor, nn

from spe.attention.fourier import MIXERS, build_mixer
from spe.attention.layer import LayerState, MultiHeadAttention
from spe.attention.pro import pro_options
from spe.encodings.code import SPECode
from spe.encodings.registry import positional_spec
from spe.ops.decay import NO_DECAY

__all__ = ["Block"]


class Block(nn.Module):
    """x + attn(norm(x)), then x + ffn(norm(x)).

    The positional module the attention layer takes (SPE filter, rotation or score term) comes
    from the registry entry of ``config.positional`` (:mod:`spe.encodings.registry`); token
    encodings and SPE code generators live in the model, not here.

    Args:
        config: a :class:`~spe.models.ModelConfig` or :class:`~spe.models.ClassifierConfig`
            (or any object with the trunk's fields and ``attention_window``). A mixer
            (:data:`spe.attention.fourier.MIXERS`, FNet) takes the attention's place.
        causal: mask the future (decoder); False for an encoder (e.g. a Long Range Arena
            classifier), where every position sees the whole sequence; then
            ``config.attention_window`` must be None (a ClassifierConfig's always is).

    Raises:
        ValueError: as :class:`~spe.attention.MultiHeadAttention` (e.g. a window without
            ``causal``).
    """

    def __init__(self, config, *, causal: bool = True) -> None:
        super().__init__()
        spec = positional_spec(config.positional)
        self.norm1 = nn.LayerNorm(config.d_model)
        if config.attention in MIXERS:  # FNet: Fourier mixing in the attention's place, no q, k, v
            self.attn = build_mixer(config, causal=causal)
        else:
            self.attn = self._attention(config, spec, causal)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.ffn = nn.Sequential(nn.Linear(config.d_model, config.d_ff), nn.GELU(),
                                 nn.Linear(config.d_ff, config.d_model))
        self.drop = nn.Dropout(config.dropout)

    @staticmethod
    def _attention(config, spec, causal: bool) -> MultiHeadAttention:
        module = spec.build_layer_module(config, causal=causal)
        return MultiHeadAttention(
            config.d_model, config.num_heads, attention=config.attention, causal=causal,
            num_realizations=config.num_realizations if spec.stochastic else None,
            num_features=config.num_features, chunk_size=config.chunk_size,
            window=config.attention_window, decay=getattr(config, "decay", NO_DECAY),
            short_conv=getattr(config, "short_conv", 0), positional=module, **pro_options(config),
            attention_blocks=getattr(config, "attention_blocks", 0) or None)

    def forward(self, x: Tensor, code: SPECode | None, positions: Tensor | None = None, *,
                key_padding_mask: Tensor | None = None, times: Tensor | None = None) -> Tensor:
        """x: (B, L, C); code: the SPE code of these L positions (SPE only); positions: (L,)
        for RoPE (default 0 … L − 1); key_padding_mask: (B, L) bool, True at padding (non-causal
        blocks, see :meth:`~spe.attention.MultiHeadAttention.forward`); times: (B, L) per-sequence
        times (the onset clock's) or None. Returns (B, L, C)."""
        return self._residuals(x, self.attn(self.norm1(x), code, positions=positions,
                                            key_padding_mask=key_padding_mask, times=times))

    def forward_with_state(self, x: Tensor, code: SPECode | None,
                           state: LayerState | None, *, times: Tensor | None = None) -> tuple[Tensor, LayerState]:
        """:meth:`forward` of a causal block going on from the attention's ``state`` (None: position
        0), dropout included: x (B, L, C) -> (B, L, C) and the attention's state after these
        positions (:meth:`~spe.attention.MultiHeadAttention.prefill`)."""
        y, state = self.attn.prefill(self.norm1(x), code, state, times=times)
        return self._residuals(x, y), state

    def _residuals(self, x: Tensor, y: Tensor) -> Tensor:
        x = x + self.drop(y)
        return x + self.drop(self.ffn(self.norm2(x)))

    def step(self, x: Tensor, code: SPECode | None,
             state: LayerState | None, *, times: Tensor | None = None) -> tuple[Tensor, LayerState]:
        """One causal decoding step: x (B, 1, C) -> (B, 1, C) and the attention's new state
        (times: (B, 1), as :meth:`forward`)."""
        y, state = self.attn.step(self.norm1(x), code, state, times=times)
        return self._feed_forward(x + y), state

    def prefill(self, x: Tensor, code: SPECode | None, *, times: Tensor | None = None) -> tuple[Tensor, LayerState]:
        """Causal decoding of positions 0 … L − 1 at once: x (B, L, C) -> (B, L, C) and the
        attention's state after them (:meth:`~spe.attention.MultiHeadAttention.prefill`; times as
        :meth:`forward`)."""
        y, state = self.attn.prefill(self.norm1(x), code, times=times)
        return self._feed_forward(x + y), state

    def _feed_forward(self, x: Tensor) -> Tensor:
        return x + self.ffn(self.norm2(x))  # decoding: no dropout
