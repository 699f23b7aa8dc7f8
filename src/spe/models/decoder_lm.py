"""Decoder-only language model: the causal trunk and a next-token head.

Letters: B = batch, L = length, C = d_model, V = vocab_size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from spe.attention.fourier import MIXERS
from spe.attention.layer import LayerState
from spe.encodings.onset import OnsetClock, OnsetState, reads_onsets
from spe.models.config import ModelConfig
from spe.models.loss import cross_entropy
from spe.models.trunk import Trunk, check_token_ids

__all__ = ["DecoderLM", "DecodingState"]


@dataclass
class DecodingState:
    """Explicit state of recurrent decoding (:meth:`DecoderLM.step`).

    Attributes:
        position: index of the next position to be fed.
        layers: one attention state per block (:data:`spe.ops.common.state.AttentionState`): running
            sums for linear kernels, or the last W keys and values with a window; the keys and
            values seen for softmax; with ``short_conv`` a
            :class:`~spe.encodings.short_conv.ShortConvState` holding it and the last K − 1
            projected inputs.
        clock: sineSPE on the onset clock (``spe_time="onset"``): the running bar and position
            after the tokens fed (:class:`~spe.encodings.onset.OnsetState`); None otherwise.
    """

    position: int
    layers: list[LayerState]
    clock: OnsetState | None = None


class DecoderLM(Trunk):
    """Autoregressive language model over token ids.

    The trunk (:class:`~spe.models.trunk.Trunk`) with causal blocks and a linear head to V
    logits, tied to the token embedding with ``config.tie_embeddings``. Codes are drawn as
    the trunk says; in eval mode a prefix gets the same code whatever length follows it, so
    :meth:`forward` and :meth:`step` agree. On the onset clock (``spe_time="onset"``) the model
    computes each sequence's times from its tokens (:mod:`spe.encodings.onset`) and hands them
    to its layers; decoding carries the clock in :attr:`DecodingState.clock`.

    Args:
        config: the model configuration.

    Raises:
        ValueError: on the onset clock without ``onset_tokens`` and ``onset_scale`` > 0, or with
            a vocabulary that has no onsets (:func:`~spe.encodings.onset.onset_tokens`).
    """

    MODEL_KIND = "decoder-lm"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, causal=True)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight
        self.onset_clock = None
        if reads_onsets(config):
            if not config.onset_tokens or not config.onset_scale > 0:
                raise ValueError("spe_time 'onset' reads the onsets of REMI tokens (music only): the model config "
                                 "needs onset_tokens and onset_scale > 0 (spe train sets them from the corpus)")
            self.onset_clock = OnsetClock(config.onset_tokens, config.vocab_size)

    def _times(self, tokens: Tensor, clock: OnsetState | None) -> tuple[Tensor | None, OnsetState | None]:
        """(B, L) onset times τ = s · onset (beats, :mod:`spe.encodings.onset`) of ``tokens`` going
        on from ``clock``, and the clock's state after them; (None, None) without the onset clock."""
        if self.onset_clock is None:
            return None, None
        onsets, clock = self.onset_clock(tokens, clock)
        return onsets * self.config.onset_scale, clock

    def build_head(self) -> nn.Module:
        return nn.Linear(self.config.d_model, self.config.vocab_size, bias=False)

    def set_attention_window(self, window: int | None) -> None:
        """Sets every layer's sliding attention window W (None: the whole past), e.g. at test
        time to the training length, and records it in ``config.attention_window``.

        Raises:
            ValueError: if W is not a positive integer or the model has a score encoding.
        """
        if window is not None and self.spec.acts_on == "scores":
            raise ValueError(f"an attention window cannot be combined with positional {self.config.positional!r}")
        if window is not None and self.config.attention in MIXERS:
            raise ValueError(f"attention {self.config.attention!r} is a Fourier mixer, with no attention window")
        for block in self.blocks:
            block.attn.window = window
        self.config.attention_window = window

    def forward(self, tokens: Tensor, *, positions: Tensor | None = None,
                generator: torch.Generator | None = None, num_realizations: int | None = None,
                state: DecodingState | None = None, return_state: bool = False):
        """Args:
            tokens: (B, L) token ids in [0, V).
            positions: (L,) positions shared by the batch (default 0 … L−1). With ``sinespe``
                and ``rope`` they may be real-valued, e.g. onset times in beats (continuous
                positions); ``convspe`` and ``ape-learned`` need integers; the score encodings
                (``shaw``, ``music-relative`` …) use index distances and take none. On the
                onset clock (``spe_time="onset"``) the times come from the tokens
                (:mod:`spe.encodings.onset`): none are taken.
            generator: source of the SPE code in training mode.
            num_realizations: R for this pass (default: the config's), e.g. a test-time R.
            state, return_state: go on from a decoding state and/or return the final one, as
                :meth:`forward_with_state` (through ``model(...)``, so that DDP and
                ``torch.compile`` wrappers see the call); positions then run on from the state's.

        Returns:
            (B, L, V) logits of the next token at each position; with ``return_state`` also
            the :class:`DecodingState` after them.

        Raises:
            ValueError: on a tensor that is not (batch, length), ids out of range (checked
                on the CPU; on CUDA a device-side assertion, see
                :func:`~spe.models.trunk.check_in_range`), positions with a score encoding,
                the onset clock or a state, or ``ape-learned`` positions beyond ``max_positions``.
        """
        if state is not None or return_state:
            if positions is not None:
                raise ValueError("positions run on from the decoding state's: pass none with a state")
            logits, state = self._forward_with_state(tokens, state, generator, num_realizations)
            return (logits, state) if return_state else logits
        self.check_tokens(tokens)
        n = tokens.shape[1]
        if positions is not None and self.spec.acts_on == "scores":
            raise ValueError(f"positional {self.config.positional!r} works on index distances; it takes no positions")
        if positions is not None and self.onset_clock is not None:
            raise ValueError("sineSPE on the onset clock reads its times from the tokens; it takes no positions")
        if positions is None:
            positions = torch.arange(n, device=tokens.device)
        elif positions.shape != (n,):
            raise ValueError(f"positions must have shape ({n},) like the tokens' length, got {tuple(positions.shape)}")
        times = self._times(tokens, None)[0] if n else None
        return self.head(self.hidden(tokens, positions, generator=generator, num_realizations=num_realizations,
                                     times=times))

    def forward_with_state(self, tokens: Tensor, state: DecodingState | None = None, *,
                           generator: torch.Generator | None = None) -> tuple[Tensor, DecodingState]:
        """The causal parallel forward going on from a decoding state, with gradients, and the final state.

        Positions run from ``state.position`` (p; 0 without a state): tokens, SPE codes, RoPE
        and feature transforms are those of positions p … p + L − 1, and every layer's kernel
        starts from its carried state (:meth:`~spe.models.block.Block.forward_with_state`),
        so the logits are those of :meth:`forward` over the whole sequence that left ``state``
        followed by ``tokens``, restricted to the last L positions, when the SPE code is the same
        realisation (draw both from generators of one seed: the noise does not depend on the
        positions asked for). Dropout and codes as :meth:`forward` in the current mode. Used by
        state passing in training (:mod:`spe.lab.music.state_passing`); the returned state keeps
        its autograd graph: detach it before carrying it over an optimizer step.

        Args:
            tokens: (B, L) token ids of positions p … p + L − 1, L ≥ 1.
            state: the state after position p − 1 (:meth:`step`, :meth:`prefill` or an earlier
                call), or None.
            generator: source of the SPE code in training mode (as :meth:`forward`).

        Returns:
            (B, L, V) logits and the state after position p + L − 1.

        Raises:
            ValueError: as :meth:`forward`; a state of another number of layers or window, or a
                softmax KV cache (softmax goes on from one with :meth:`step` only).
            TypeError: on a layer state of the wrong kind.
        """
        return self(tokens, generator=generator, state=state, return_state=True)

    def _forward_with_state(self, tokens: Tensor, state: DecodingState | None, generator: torch.Generator | None,
                            num_realizations: int | None) -> tuple[Tensor, DecodingState]:
        self.check_tokens(tokens)
        if tokens.shape[1] == 0:
            raise ValueError("a forward from a state takes at least one token per sequence, got length 0")
        if state is not None and len(state.layers) != len(self.blocks):
            raise ValueError(f"the decoding state holds {len(state.layers)} layer states, this model has "
                             f"{len(self.blocks)} blocks")
        start = 0 if state is None else state.position
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        times, clock = self._times(tokens, None if state is None else state.clock)
        x = self.drop(self.embed_tokens(tokens, positions))  # (B, L, C)
        codes = self.draw_codes(positions, generator=generator, num_realizations=num_realizations)
        layers = []
        for i, (block, code) in enumerate(zip(self.blocks, codes)):
            x, layer_state = block.forward_with_state(x, code, None if state is None else state.layers[i], times=times)
            layers.append(layer_state)
        return self.head(self.norm(x)), DecodingState(position=start + tokens.shape[1], layers=layers, clock=clock)

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

        Raises:
            ValueError: on a tensor that is not (batch,) or ids out of range (as :meth:`forward`).
        """
        if tokens.dim() != 1:
            raise ValueError(f"step takes one token per sequence, shape (batch,), got {tuple(tokens.shape)}")
        check_token_ids(tokens, self.config.vocab_size)
        position = 0 if state is None else state.position
        pos = torch.tensor([position], device=tokens.device)
        times, clock = self._times(tokens[:, None], None if state is None else state.clock)
        x = self.embed_tokens(tokens[:, None], pos)  # (B, 1, C)
        layers = []
        for i, (block, code) in enumerate(zip(self.blocks, self._decoding_codes(pos))):
            x, layer_state = block.step(x, code, None if state is None else state.layers[i], times=times)
            layers.append(layer_state)
        return self.head(self.norm(x))[:, 0], DecodingState(position=position + 1, layers=layers, clock=clock)

    @torch.no_grad()
    def prefill(self, tokens: Tensor) -> tuple[Tensor, DecodingState]:
        """Recurrent decoding of a whole prompt in one parallel pass.

        Gives what :meth:`step` on ``tokens[:, 0]``, ``tokens[:, 1]``, … from a fresh state
        gives (the same logits, within float rounding, and a state that :meth:`step` continues),
        at the cost of one causal forward: every layer runs its parallel kernel and returns its
        final state (:meth:`~spe.attention.MultiHeadAttention.prefill`).

        Args:
            tokens: (B, L) token ids of positions 0 … L − 1, L ≥ 1.

        Returns:
            (B, L, V) logits of the next token at each position, and the state at position L.

        Raises:
            ValueError: on a tensor that is not (batch, length) with L ≥ 1, ids out of range
                (as :meth:`forward`), or ``ape-learned`` positions beyond ``max_positions``.
        """
        self.check_tokens(tokens)
        if tokens.shape[1] == 0:
            raise ValueError("prefill takes at least one token per sequence, got length 0")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        times, clock = self._times(tokens, None)
        x = self.embed_tokens(tokens, positions)  # (B, L, C)
        layers = []
        for block, code in zip(self.blocks, self._decoding_codes(positions)):
            x, layer_state = block.prefill(x, code, times=times)
            layers.append(layer_state)
        return self.head(self.norm(x)), DecodingState(position=tokens.shape[1], layers=layers, clock=clock)

    def _decoding_codes(self, positions: Tensor) -> list:
        # the code of eval mode (from config.code_seed) in any mode: what forward in eval mode uses
        return self.draw_codes(positions, generator=torch.Generator().manual_seed(self.config.code_seed))

    def loss(self, tokens: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        """Mean next-token cross-entropy (nats) of (B, L) tokens, predicting tokens[:, 1:]."""
        logits = self(tokens[:, :-1], generator=generator)
        return cross_entropy(logits, tokens[:, 1:])
