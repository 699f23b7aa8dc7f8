"""State passing (Buitrago Ruiz & Gu 2025, "Understanding and improving length generalization in
recurrent models", §4.1), for ``spe train --state-passing``.

Recurrent models fail beyond the training length because training only ever shows them the
states that L tokens from a zero state produce. State passing starts each training sequence
from the final state of another sequence, the previous batch's, detached, so the model learns
on the states that long contexts produce at the cost of carrying B states between steps.

What this module does (letters: B = batch, L = training length, K = :data:`CHAIN_STEPS`):

* crop i of a step starts from the detached final state of crop i of the previous step
  (every layer's kernel state: running sums, or a window's kept keys, with their gates; and a
  short convolution's cache; a token shift's previous keys and values); crops are drawn as without state passing, so that state comes
  from another piece or another place in one: the paper's state passing, not truncated
  backpropagation through a continued document. It applies at every step of a run trained
  with it; the paper post-trains with it, which switching it on when resuming does;
* positions go on from the state's: the crop of the n-th step of a chain (n = 0, 1, …) sits
  at positions [nL, nL + L) (:meth:`~spe.models.DecoderLM.forward_with_state`), since SPE
  codes, RoPE and the feature transforms depend on the absolute positions and the carried
  keys sit at the previous crop's;
* one SPE code realisation per chain (a seed drawn from the ``code`` generator when a chain
  starts): the carried keys were filtered with it, and queries filtered with an independent
  one would estimate nothing about them;
* a chain restarts from no state (its first crop is a plain one) every K steps of the run,
  and at every FAVOR+ feature redraw (the carried sums hold features of the old projection):
  positions stay below K·L, the range of
  the 16× protocol at K = 16, fewer where the model has a position limit (``ape-learned``'s
  ``max_positions``, an L_max); without a decay the running sums of a never-ending
  chain would hold an unbounded past, which no evaluation asks for;
* the loss is the usual mean cross-entropy of the L positions of each crop; no gradient
  reaches the previous step; validation is unchanged (no state);
* the carried states, the chain's code seed and position are saved in ``train_state.pt``
  (one entry per process under ``torchrun``: each carries its own slice's states), so a
  resume continues the same trajectory bit for bit.

Kernels with a KV cache (softmax, hence the score encodings) have no fixed-size state to pass:
:func:`chain_steps` refuses them before any data is read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from spe.attention.fourier import MIXERS
from spe.attention.kernels import KERNELS
from spe.encodings.registry import positional_spec
from spe.attention.pro import ShiftState
from spe.encodings.short_conv import ShortConvState
from spe.encodings.spec import EncodingState
from spe.models.config import ModelConfig
from spe.models.decoder_lm import DecodingState
from spe.encodings.onset import OnsetState
from spe.ops.common.state import (
    KVCache,
    LinearAttentionState,
    RecentKeys,
    ScaledLinearAttentionState,
    ScaledRecentKeys,
)

__all__ = ["CHAIN_STEPS", "CarriedBatch", "StatePassing", "chain_steps", "state_from_dict", "state_to_dict"]

# Steps of one chain: positions reach 16 L, the end of the 16× protocol (docs/gates.md).
CHAIN_STEPS = 16
# The types a carried state is made of, by name (train_state.pt holds data only).
_STATE_TYPES = {cls.__name__: cls for cls in (DecodingState, ShortConvState, ShiftState, EncodingState,
                                               LinearAttentionState, ScaledLinearAttentionState, RecentKeys,
                                               ScaledRecentKeys, OnsetState)}


def chain_steps(model: ModelConfig, seq_len: int) -> int:
    """K, the steps of one state-passing chain for ``model`` trained on crops of ``seq_len`` tokens:
    :data:`CHAIN_STEPS`, or fewer where the model's positions stop before K · L.

    Raises:
        ValueError: for a kernel without a fixed-size recurrent state (softmax, and with it the
            score encodings), or a position limit below 2 L (no room for a second crop).
    """
    recurrent = [name for name, spec in KERNELS.items() if KVCache not in spec.state_types]
    if model.attention in MIXERS:
        raise ValueError(f"state_passing carries the states of attention kernels ({', '.join(recurrent)}), "
                         f"not a Fourier mixer's ({model.attention}): train it without state_passing")
    if model.attention not in recurrent:
        why = (f" (positional {model.positional} acts on its scores)"
               if positional_spec(model.positional).acts_on == "scores" else "")
        raise ValueError(f"state_passing needs a recurrent-state kernel ({', '.join(recurrent)}); "
                         f"{model.attention} keeps a KV cache{why}")
    limit = model.position_limit
    if limit is None:
        return CHAIN_STEPS
    if limit < 2 * seq_len:
        what = positional_spec(model.positional).limit_text
        raise ValueError(f"state_passing carries crops on to positions [{seq_len}, {2 * seq_len}) and beyond, "
                         f"but {model.positional} takes {limit} {what}: raise it to at least "
                         f"2 × seq_len = {2 * seq_len}, or train without state_passing")
    return min(CHAIN_STEPS, limit // seq_len)


def _map_tensors(state, fn):
    """``state`` (a decoding state, a list of them, or a leaf) with ``fn`` applied to every tensor."""
    if isinstance(state, Tensor):
        return fn(state)
    if isinstance(state, list):
        return [_map_tensors(item, fn) for item in state]
    if dataclasses.is_dataclass(state):
        return dataclasses.replace(state, **{f.name: _map_tensors(getattr(state, f.name), fn)
                                             for f in dataclasses.fields(state) if f.init})
    return state


def state_to_dict(state: DecodingState) -> dict:
    """A :class:`~spe.models.DecodingState` of linear kernels as nested dicts, lists, tensors (on
    the CPU) and numbers, each state named by its ``type``: what ``torch.load(weights_only=True)``
    reads back (:func:`state_from_dict`)."""
    if isinstance(state, list):
        return [state_to_dict(item) for item in state]
    if isinstance(state, Tensor):
        return state.detach().cpu().clone()
    if not dataclasses.is_dataclass(state):
        return state
    if type(state).__name__ not in _STATE_TYPES:
        raise TypeError(f"state passing carries no {type(state).__name__}")
    return {"type": type(state).__name__, **{f.name: state_to_dict(getattr(state, f.name))
                                             for f in dataclasses.fields(state) if f.init}}


def state_from_dict(saved):
    """The state :func:`state_to_dict` wrote (tensors where they were loaded).

    Raises:
        ValueError: on a type it does not know, or fields the state's own checks refuse.
    """
    if isinstance(saved, list):
        return [state_from_dict(item) for item in saved]
    if not isinstance(saved, dict):
        return saved
    fields = dict(saved)
    kind = _STATE_TYPES.get(fields.pop("type", None))
    if kind is None:
        raise ValueError(f"not a carried state: {saved.get('type')!r}")
    return kind(**{name: state_from_dict(value) for name, value in fields.items()})


@dataclass
class CarriedBatch:
    """A training batch of state passing: what :meth:`LMTask.loss` needs to run it again (a
    compiled step that fails is re-run eagerly from the same batch).

    Attributes:
        tokens: (B, L + 1) crops.
        state: the detached state the crops start from (None: a chain's first step).
        code_seed: seed of the chain's SPE code.
    """

    tokens: Tensor
    state: DecodingState | None
    code_seed: int

    def code_generator(self) -> torch.Generator:
        """A generator of the chain's code realisation (the same at every step of the chain)."""
        return torch.Generator().manual_seed(self.code_seed)


class StatePassing:
    """The carried states of one process between training steps (see the module docstring).

    Args:
        chain_steps: K, steps of a chain (:func:`chain_steps`).
        redraw_every: steps between FAVOR+ feature redraws (0: never); a chain restarts at each.
    """

    def __init__(self, chain_steps: int, redraw_every: int = 0) -> None:
        self.chain_steps, self.redraw_every = chain_steps, redraw_every
        self.step = 0  # steps drawn so far: the engine's step
        self.state: DecodingState | None = None
        self.code_seed = 0

    def batch(self, tokens: Tensor, code: torch.Generator) -> CarriedBatch:
        """The batch of the next step: ``tokens`` with the state they start from.

        A chain starts (no state, a new code seed from ``code``) every K steps, at redraws, and
        where there is no state to go on from (a resume of a run saved without state passing).
        """
        redraw = self.redraw_every and self.step % self.redraw_every == 0
        if self.state is None or self.step % self.chain_steps == 0 or redraw:
            self.state = None
            self.code_seed = int(torch.randint(0, 1 << 62, (1,), generator=code))
        self.step += 1
        state = None if self.state is None else _map_tensors(self.state, lambda t: t.to(tokens.device))
        return CarriedBatch(tokens, state, self.code_seed)

    def carry(self, final: DecodingState) -> None:
        """Keeps the final state of this step's crops, detached (and copied out of the step's
        activations, which a window's kept keys are views of), for the next step."""
        self.state = _map_tensors(final, lambda t: t.detach().clone())

    def state_dict(self) -> dict:
        """What resuming needs: the carried state (CPU tensors) and the chain's code seed."""
        return {"state": None if self.state is None else state_to_dict(self.state), "code_seed": self.code_seed}

    def load_state_dict(self, saved: dict | None, *, step: int) -> None:
        """Goes on at the engine's ``step`` from ``saved`` (None: a run saved without state passing,
        whose chain starts at the next step)."""
        self.step = step
        saved = saved or {"state": None, "code_seed": 0}
        self.state = None if saved["state"] is None else state_from_dict(saved["state"])
        self.code_seed = saved["code_seed"]
