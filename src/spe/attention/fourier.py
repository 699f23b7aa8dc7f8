"""Fourier mixers: FNet's token mixing in place of the attention sublayer, and its causal twin.

Letters: B = batch, L = length, C = d_model, N = ``fourier_length``.

A mixer has no queries, keys, values, heads or parameters: the block keeps its norms and its
feed-forward sublayer and replaces attention by y = Re(F_L F_C x) (FNet, Lee-Thorp et al.
2022) or, in a decoder, by the lower triangle of the N-point DFT (:mod:`spe.ops.fourier`).
:data:`MIXERS` is the one place their names are declared; model configs accept
``attention`` from the kernels' registry and from it, and the command line lists both.

Both use the unitary scale (``norm="ortho"``: 1/√C on channels, 1/√N on positions) rather than
FNet's unscaled DFT: FNet's blocks are post-norm, LayerNorm(x + F(x)), so the size of F(x)
is normalised right after the sum; here blocks are pre-norm, x + F(norm(x)), where an
unscaled DFT would add √(L·C) times the input to the residual stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from spe.encodings.registry import POSITIONAL_SPECS, positional_names
from spe.ops.fourier import FourierState, causal_fourier_mixing_with_state, fourier_mixing, fourier_mixing_step

__all__ = ["MIXERS", "FourierMixer", "MixerSpec", "build_mixer", "check_mixer"]


@dataclass(frozen=True)
class MixerSpec:
    """A token mixer that replaces the attention sublayer.

    Attributes:
        name: the string of configs and the command line.
        source: what it computes, and the reference.
        causal: whether it is the decoder's form (the encoder's when False).
        default_positional: the positional encoding the command line gives it when none is named
            (FNet's: learned or sinusoidal absolute embeddings; ``ape``).
    """

    name: str
    source: str
    causal: bool
    default_positional: str = "ape"


MIXERS: dict[str, MixerSpec] = {spec.name: spec for spec in (
    MixerSpec("fnet", "y = Re(F_L F_C x), no parameters (FNet, Lee-Thorp et al. 2022)", causal=False),
    MixerSpec("fnet-causal", "y_m = Re(Σ_{n≤m} w^{mn} u_n), the N-point DFT's lower triangle by chirp "
              "convolution (Bluestein)", causal=True),
)}

# The attention sublayer's options a mixer has not (no queries, keys or heads), with their values
# meaning "none"; attention_blocks and attention_window are read where a config has them.
_ATTENTION_ONLY = ("decay", "short_conv", "output_gate", "qk_norm", "kv_shift", "output_norm",
                   "attention_window", "attention_blocks")

_PLACES = {"queries-keys": "queries and keys", "scores": "attention scores", "features": "a kernel's features"}


def _set(value) -> bool:
    return value not in (None, 0, False, "none")


def check_mixer(config, *, causal: bool) -> None:
    """The rules of a model whose ``config.attention`` is a mixer (:data:`MIXERS`).

    Args:
        config: a model config (:class:`~spe.models.TrunkConfig` or a subclass).
        causal: whether the model is a decoder.

    Raises:
        ValueError: one line naming the option: a mixer of the other causality, a positional
            encoding that does not act on tokens, any option of :data:`_ATTENTION_ONLY` set, or a
            bad ``fourier_length`` (required by ``fnet-causal``, a positive int; none for ``fnet``).
    """
    spec = MIXERS[config.attention]
    if spec.causal != causal:
        other = next(m.name for m in MIXERS.values() if m.causal == causal)
        raise ValueError(f"attention {spec.name!r} is {'causal' if spec.causal else 'not causal'}: "
                         f"{'an encoder' if not causal else 'a decoder'} takes {other!r}")
    acts_on = POSITIONAL_SPECS[config.positional].acts_on
    if acts_on not in (None, "tokens"):
        tokens = ", ".join(positional_names(acts_on="tokens"))
        raise ValueError(f"positional {config.positional!r} acts on {_PLACES.get(acts_on, acts_on)}; attention {spec.name!r} mixes "
                         f"tokens by a Fourier transform and has no queries or keys: use {tokens} or none")
    for name in _ATTENTION_ONLY:
        value = getattr(config, name, None)
        if _set(value):
            raise ValueError(f"{name} = {value!r} is an option of attention; {spec.name!r} has no queries or "
                             f"keys: leave {name} out")
    length = getattr(config, "fourier_length", None)
    if spec.causal and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
        raise ValueError(f"attention {spec.name!r} needs fourier_length, its DFT length N (a positive integer, "
                         f"e.g. the training length), got {length!r}")
    if not spec.causal and length is not None:
        raise ValueError(f"fourier_length is the DFT length of 'fnet-causal'; {spec.name!r} mixes over each "
                         f"sequence's own length: leave it out")


class FourierMixer(nn.Module):
    """The attention sublayer's place in a block, filled by Fourier mixing (no parameters).

    Takes and returns what :class:`~spe.attention.MultiHeadAttention` does (the SPE code,
    positions and times are ignored: a mixer takes encodings on tokens only), so
    :class:`~spe.models.block.Block` calls either alike.

    Args:
        attention: a :data:`MIXERS` name.
        length: N of ``fnet-causal`` (None for ``fnet``).
    """

    def __init__(self, attention: str, *, length: int | None = None) -> None:
        super().__init__()
        self.attention = attention
        self.causal = MIXERS[attention].causal
        self.length = length

    def extra_repr(self) -> str:
        return f"{self.attention!r}" + (f", fourier_length={self.length}" if self.causal else "")

    def forward(self, x: Tensor, code=None, positions: Tensor | None = None, *,
                key_padding_mask: Tensor | None = None, times: Tensor | None = None) -> Tensor:
        """x: (B, L, C) -> (B, L, C); key_padding_mask: (B, L) bool, True at padding (``fnet``
        only; each sequence is mixed over its own length, see :func:`spe.ops.fourier.fourier_mixing`)."""
        return fourier_mixing(x, causal=self.causal, length=self.length, norm="ortho",
                              key_padding_mask=key_padding_mask)

    def prefill(self, x: Tensor, code=None, state: FourierState | None = None, *,
                times: Tensor | None = None) -> tuple[Tensor, FourierState]:
        """Causal mixing of positions p … p + L − 1 going on from ``state`` (None: p = 0): the
        outputs and the state after them (:func:`spe.ops.fourier.causal_fourier_mixing_with_state`)."""
        self._check_state(state)
        return causal_fourier_mixing_with_state(x, self.length, norm="ortho", initial_state=state)

    def step(self, x: Tensor, code=None, state: FourierState | None = None, *,
             times: Tensor | None = None) -> tuple[Tensor, FourierState]:
        """One decoding step, x (B, 1, C) -> (B, 1, C) and the new state, O(N·C)
        (:func:`spe.ops.fourier.fourier_mixing_step`)."""
        self._check_state(state)
        return fourier_mixing_step(x, state, self.length, norm="ortho")

    def _check_state(self, state) -> None:
        if not self.causal:
            raise ValueError(f"attention {self.attention!r} is not causal: it does not decode step by step")
        if state is not None and not isinstance(state, FourierState):
            raise TypeError(f"a Fourier mixer goes on from a FourierState, got {type(state).__name__}")

    def redraw_features(self, generator=None) -> None:
        """Nothing to redraw (no random features)."""


def build_mixer(config, *, causal: bool) -> FourierMixer:
    """The mixer of ``config.attention`` (a :data:`MIXERS` name), checked by :func:`check_mixer`."""
    check_mixer(config, causal=causal)
    return FourierMixer(config.attention, length=getattr(config, "fourier_length", None) if causal else None)
