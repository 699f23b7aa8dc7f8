"""The report's generation section: a validation prompt as MIDI, where its continuation starts,
and the style similarity of each continuation part to the prompt (Figure 5, appendix C.2).

Needs the ``music`` extra (symusic, MidiTok).
"""

from __future__ import annotations

import os
from pathlib import Path

from spe.checkpoint import atomic_write
from spe.lab.metrics.style import onset_duration_profile, split_equal_parts, style_similarity, time_pitch_profile

__all__ = ["NUM_PARTS", "PROMPT_BARS", "bar_count", "bar_start", "style_rows", "write_prompt"]

PROMPT_BARS = 2
NUM_PARTS = 4


def write_prompt(val_pieces, tokenizer, path: Path) -> tuple[int, dict]:
    """Writes the first PROMPT_BARS bars of a validation piece as MIDI; returns (bars, facts)."""
    bar = tokenizer.vocab["Bar_None"]
    bars_of = [[i for i, t in enumerate(p) if t == bar] for p in val_pieces]
    # A piece that goes on after the prompt, so the prompt is exactly PROMPT_BARS bars.
    pick = next((i for i, b in enumerate(bars_of) if len(b) > PROMPT_BARS),
                max(range(len(val_pieces)), key=lambda i: len(val_pieces[i])))
    ids = [int(t) for t in val_pieces[pick]]
    if len(bars_of[pick]) > PROMPT_BARS:
        ids = ids[:bars_of[pick][PROMPT_BARS]]
    score = tokenizer.decode(ids)
    atomic_write(path, lambda tmp: score.dump_midi(tmp))
    bars = min(len(bars_of[pick]), PROMPT_BARS)
    return bars, {"validation_piece": pick, "tokens": len(ids), "bars": bars,
                  "notes": sum(len(t.notes) for t in score.tracks)}


def bar_start(score, bar: int) -> int:
    """Tick where bar ``bar`` (0-based) starts, following the score's time signatures (4/4 if none).

    REMI changes time signature only at bar lines, so bars are walked one at a time with the
    signature in force at each bar's start.
    """
    return _walk_bars(score, bar)[1]


def bar_count(score) -> int:
    """How many bars start before the score's end (by its time signatures, 4/4 if none)."""
    return _walk_bars(score, None)[0]


def _walk_bars(score, bar: int | None) -> tuple[int, int]:
    """(bars walked, the tick reached): ``bar`` bars, or (None) until the score's end."""
    signatures = sorted((int(ts.time), int(ts.numerator), int(ts.denominator)) for ts in score.time_signatures)
    tick, walked, end = 0, 0, score.end()
    while walked < bar if bar is not None else tick < end:
        _, num, den = next((s for s in reversed(signatures) if s[0] <= tick), (0, 4, 4))
        tick += max(score.tpq * 4 * num // den, 1)  # a bar of num notes of 1/den whole note
        walked += 1
    return walked, tick


def style_rows(prompt: str | os.PathLike, generated: str | os.PathLike, prompt_end_tick: int, *,
               num_parts: int = NUM_PARTS) -> dict:
    """Cosine similarity of both style profiles between the prompt and each continuation part."""
    from symusic import Score

    ref = Score(str(prompt))
    ref_od, ref_tp = onset_duration_profile(ref), time_pitch_profile(ref)
    score = Score(str(generated))
    parts = split_equal_parts(score, num_parts, start=prompt_end_tick, end=max(score.end(), prompt_end_tick))
    return {"onset_duration": [style_similarity(ref_od, onset_duration_profile(p)) for p in parts],
            "time_pitch": [style_similarity(ref_tp, time_pitch_profile(p)) for p in parts],
            "notes_per_part": [sum(len(t.notes) for t in p.tracks) for p in parts],
            "beats": (max(score.end(), prompt_end_tick) - prompt_end_tick) / score.tpq}
