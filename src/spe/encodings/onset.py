"""The music's own clock: the onset of each REMI token in beats, for sineSPE on the onset clock.

Letters: B = batch, L = length, V = vocabulary.

MidiTok's REMI (3.1, ``use_programs=True, one_token_stream_for_programs=True``) writes time
with ``Bar`` tokens (a new bar begins), each followed by ``TimeSig_n/d`` (the bar's time
signature) and ``Position_k`` tokens (the onset within the bar, in 1/res of the time
signature's beat, res = MidiTok's ``max_num_pos_per_beat``, 8 by default); the tokens of a note
(program, pitch, velocity, duration) follow their position and share its onset. As MidiTok
decodes them (``REMI._tokens_to_score``):

* a ``Bar`` starts the next bar, the previous bar's length after the last bar start (the first
  ``Bar`` of a sequence starts bar 0 at time 0, unless a ``Position`` came before it, which then
  sits in bar 0);
* ``TimeSig_n/d`` sets the current bar's length to n·4/d beats and a position's size to
  4/(d·res) beats (4/4 until one is seen);
* ``Position_k`` is at the bar's start + k positions;
* every other token inherits the last onset (0 before any).

A beat here is a quarter note (MidiTok's ``ticks_per_quarter``), the same unit whatever the time
signature. Onsets are returned relative to the sequence's first token (its onset is 0): the
encodings read differences only, and a crop of a piece that starts mid-bar then starts at 0
like the piece does; its tokens before the crop's first ``Bar`` are placed in an assumed bar 0
(4/4 until a ``TimeSig``), which may misplace them by a bar's fraction, as MidiTok would.

:class:`OnsetClock` computes the onsets of a whole sequence at once (forward fills and a
cumulative sum, no loop over positions) and goes on from an :class:`OnsetState` (the running
bar and position), so decoding advances the clock from the tokens it samples and gives the
parallel pass's times. :func:`remi_onsets_reference` is its slow twin on token strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["OnsetClock", "OnsetState", "onset_tokens", "reads_onsets", "remi_onsets", "remi_onsets_reference",
           "tokens_per_beat"]

_POSITION = re.compile(r"Position_(\d+)$")
_TIME_SIG = re.compile(r"TimeSig_(\d+)/(\d+)$")
_BAR = re.compile(r"Bar_(None|\d+)$")
# Token kinds in the clock's table.
_OTHER, _BAR_KIND, _POSITION_KIND, _TIME_SIG_KIND = 0, 1, 2, 3
_QUARTERS_PER_WHOLE = 4.0


def reads_onsets(config) -> bool:
    """Whether a model config's encoding reads the onset clock (sineSPE with ``spe_time="onset"``)."""
    return config.positional == "sinespe" and getattr(config, "spe_time", "index") == "onset"


def onset_tokens(vocab: dict[str, int]) -> dict[str, int]:
    """The tokens of a REMI vocabulary (token string → id) that move the clock: ``Bar``,
    ``Position_k`` and ``TimeSig_n/d`` (what a model config records, :class:`OnsetClock`).

    Raises:
        ValueError: if the vocabulary has no ``Bar`` or no ``Position`` token (not REMI: the
            task has no onsets), has ``Rest`` tokens (time the clock does not read), or a
            ``TimeSig_n/d`` with n or d 0 (naming it).
    """
    if any(name.startswith("Rest_") for name in vocab):
        raise ValueError("the onset clock reads REMI's Bar and Position tokens; this vocabulary has Rest tokens, "
                         "which it does not read")
    kept = {name: int(i) for name, i in vocab.items() if _BAR.match(name) or _POSITION.match(name)
            or _TIME_SIG.match(name)}
    if not any(_BAR.match(n) for n in kept) or not any(_POSITION.match(n) for n in kept):
        raise ValueError("the onset clock needs a REMI vocabulary (Bar and Position_k tokens): this task's "
                         "tokens have no onsets")
    for name in kept:  # a bar of 0 beats, or beats of 1/0 of a whole note (a hand-edited header)
        if (m := _TIME_SIG.match(name)) and (int(m.group(1)) < 1 or int(m.group(2)) < 1):
            raise ValueError(f"the onset clock's token {name!r} is no time signature: TimeSig_n/d takes n ≥ 1 "
                             "beats of 1/d ≥ 1 of a whole note")
    return kept


def _resolution(tokens: dict[str, int]) -> int:
    """MidiTok's positions per beat: its Position tokens cover the longest bar (the largest
    numerator of the time signatures, 4 without them) at res positions per beat."""
    positions = 1 + max(int(m.group(1)) for m in map(_POSITION.match, tokens) if m)
    beats = max([int(m.group(1)) for m in map(_TIME_SIG.match, tokens) if m] or [4])
    if positions % beats:
        raise ValueError(f"the onset clock cannot read {positions} Position tokens for bars of at most {beats} "
                         f"beats: not MidiTok's REMI")
    return positions // beats


@dataclass
class OnsetState:
    """The clock after a sequence's last token (per sequence, (B,) tensors).

    Attributes:
        bar_start: the current bar's start (beats, float64).
        bar_length: its length (beats) under the current time signature.
        unit: a position's size (beats).
        started: a Bar or Position was seen (the next Bar advances).
        onset: the last token's onset (beats, absolute).
        origin: the sequence's first token's onset (the times are relative to it).
    """

    bar_start: Tensor
    bar_length: Tensor
    unit: Tensor
    started: Tensor
    onset: Tensor
    origin: Tensor


def _fill_forward(values: Tensor, mask: Tensor, initial: Tensor) -> Tensor:
    """(B, L) ``values`` at the last position ≤ t where ``mask`` is True, ``initial`` (B,) before any."""
    index = torch.arange(values.shape[1], device=values.device).expand_as(values)
    last = torch.where(mask, index, -1).cummax(dim=1).values
    return torch.where(last >= 0, values.gather(1, last.clamp(min=0)), initial[:, None])


class OnsetClock:
    """Onsets of REMI token ids in beats (see the module's docstring), on any device.

    Args:
        tokens: the clock's tokens of the vocabulary (:func:`onset_tokens`), token string → id.
        vocab_size: V; ids of other tokens inherit the last onset.

    Raises:
        ValueError: as :func:`onset_tokens` (no Bar or Position token), or an id outside [0, V).
    """

    def __init__(self, tokens: dict[str, int], vocab_size: int) -> None:
        tokens = onset_tokens(tokens)
        res = _resolution(tokens)
        kind = [_OTHER] * vocab_size
        value = [0.0] * vocab_size  # k of Position_k; a bar's beats for TimeSig
        unit = [0.0] * vocab_size  # TimeSig's position size in beats
        for name, i in tokens.items():
            if not 0 <= i < vocab_size:
                raise ValueError(f"the onset clock's token {name!r} has id {i}, outside the vocabulary [0, {vocab_size})")
            if _BAR.match(name):
                kind[i] = _BAR_KIND
            elif m := _POSITION.match(name):
                kind[i], value[i] = _POSITION_KIND, float(m.group(1))
            else:
                n, d = map(int, _TIME_SIG.match(name).groups())
                kind[i], value[i], unit[i] = _TIME_SIG_KIND, n * _QUARTERS_PER_WHOLE / d, _QUARTERS_PER_WHOLE / (d * res)
        # on the CPU whatever device models are built on (a meta device sizes them)
        self.kind = torch.tensor(kind, dtype=torch.long, device="cpu")
        self.value, self.unit = (torch.tensor(t, dtype=torch.float64, device="cpu") for t in (value, unit))
        self.resolution = res
        self._on_device: dict[torch.device, tuple[Tensor, Tensor, Tensor]] = {}

    def _tables(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """(kind, value, unit) on ``device``, copied there once (decoding reads them every step)."""
        if device not in self._on_device:
            self._on_device[device] = tuple(t.to(device) for t in (self.kind, self.value, self.unit))
        return self._on_device[device]

    def start(self, batch: int, device: torch.device | str = "cpu") -> OnsetState:
        """The state before a sequence's first token: no bar yet, 4/4."""
        zeros = torch.zeros(batch, dtype=torch.float64, device=device)
        return OnsetState(bar_start=zeros, bar_length=zeros + 4.0, unit=zeros + 1.0 / self.resolution,
                          started=torch.zeros(batch, dtype=torch.bool, device=device), onset=zeros, origin=zeros)

    def __call__(self, tokens: Tensor, state: OnsetState | None = None) -> tuple[Tensor, OnsetState]:
        """Onsets of ``tokens`` going on from ``state``.

        Args:
            tokens: (B, L) token ids, L ≥ 1.
            state: the state after the tokens before (None: these start the sequence).

        Returns:
            (B, L) float64 onsets in beats relative to the sequence's first token, and the state
            after the last token.

        Raises:
            ValueError: on tokens that are not (B, L) with L ≥ 1.
        """
        if tokens.dim() != 2 or tokens.shape[1] == 0:
            raise ValueError(f"the onset clock reads (batch, length ≥ 1) token ids, got shape {tuple(tokens.shape)}")
        first = state is None
        s = self.start(tokens.shape[0], tokens.device) if first else state
        kind, value, unit = (t[tokens] for t in self._tables(tokens.device))
        is_bar, is_position, is_sig = kind == _BAR_KIND, kind == _POSITION_KIND, kind == _TIME_SIG_KIND
        bar_length = _fill_forward(value, is_sig, s.bar_length)  # after token t
        position_unit = _fill_forward(unit, is_sig, s.unit)
        length_before = torch.cat([s.bar_length[:, None], bar_length[:, :-1]], dim=1)
        started = s.started[:, None] | (is_bar | is_position).long().cummax(dim=1).values.bool()
        started_before = torch.cat([s.started[:, None], started[:, :-1]], dim=1)
        steps = torch.where(is_bar & started_before, length_before, 0.0)
        bar_start = s.bar_start[:, None] + steps.cumsum(dim=1)
        events = torch.where(is_position, bar_start + value * position_unit, bar_start)
        onsets = _fill_forward(events, is_bar | is_position, s.onset)
        origin = onsets[:, 0] if first else s.origin
        after = OnsetState(bar_start=bar_start[:, -1], bar_length=bar_length[:, -1], unit=position_unit[:, -1],
                           started=started[:, -1], onset=onsets[:, -1], origin=origin)
        return onsets - origin[:, None], after


def remi_onsets(tokens: Tensor, vocab: dict[str, int]) -> Tensor:
    """(B, L) float64 onsets in beats of REMI token ids ``tokens`` (B, L), the first token's 0,
    under the vocabulary ``vocab`` (token string → id, MidiTok's ``tokenizer.vocab``): see the
    module's docstring.

    Raises:
        ValueError: as :class:`OnsetClock` (a vocabulary without onsets) and ``tokens`` not (B, L).
    """
    return OnsetClock(vocab, max(vocab.values()) + 1)(tokens)[0]


def remi_onsets_reference(tokens: list[str], resolution: int = 8) -> list[float]:
    """The onsets (beats, the first token's 0) of one sequence of REMI token strings, token by
    token as MidiTok decodes them (the slow twin of :class:`OnsetClock`, for tests)."""
    bar_start, bar_length, unit, started, onset, onsets = 0.0, 4.0, 1.0 / resolution, False, 0.0, []
    for name in tokens:
        if _BAR.match(name):
            bar_start = bar_start + bar_length if started else bar_start
            started, onset = True, bar_start
        elif m := _TIME_SIG.match(name):
            n, d = map(int, m.groups())
            bar_length, unit = n * 4.0 / d, 4.0 / (d * resolution)
        elif m := _POSITION.match(name):
            started, onset = True, bar_start + int(m.group(1)) * unit
        onsets.append(onset)
    return [t - onsets[0] for t in onsets] if onsets else []


def tokens_per_beat(pieces, clock: OnsetClock) -> float:
    """The corpus's mean tokens per beat: Σ tokens / Σ beats over ``pieces`` (1-D arrays or
    tensors of ids), a piece's beats being its last token's onset (pieces of one bar or less,
    with no time, count for neither).

    Raises:
        ValueError: if no piece spans any time.
    """
    tokens = beats = 0.0
    for piece in pieces:
        ids = torch.as_tensor(piece, dtype=torch.long)[None]
        if ids.shape[1] == 0:
            continue
        span = float(clock(ids)[0][0, -1])
        if span > 0:
            tokens, beats = tokens + ids.shape[1], beats + span
    if beats == 0:
        raise ValueError("the onset clock's scale needs pieces that span time: no piece has two onsets")
    return tokens / beats
