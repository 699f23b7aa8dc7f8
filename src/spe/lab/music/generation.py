"""Generation to a MIDI file: a checkpoint, an optional MIDI prompt, nucleus sampling, a ``.mid`` out.

Needs the ``music`` extra (MidiTok, symusic). The sampling itself is :func:`spe.generation.generate`.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch

from spe.checkpoint import LoadedCheckpoint, atomic_write, load
from spe.generation import generate
from spe.lab.outputs import check_output_file
from spe.paths import not_a_file

__all__ = ["generate_midi", "prompt_ids"]



def prompt_ids(tokenizer, prompt: str | os.PathLike, bars: int) -> list[int]:
    """REMI ids of the first ``bars`` bars of a MIDI file (all of it if it has fewer bars).

    Drum tracks are left out (with a warning that counts their notes): a prompt gives the
    model pitched notes. Only the first bars are tokenised (:func:`_first_bars`), so a long
    file costs about what those bars cost, not what the whole file would.

    Raises:
        FileNotFoundError: if ``prompt`` does not exist.
        ValueError: if it is not a regular file (naming what it is: a folder, a FIFO …).
        ValueError: if it cannot be read as MIDI, or if its first ``bars`` bars (``bars`` > 0)
            hold no note the tokenizer keeps, naming why: no notes at all, drums only, no
            pitch within the tokenizer's range, or no such note in those bars.
    """
    from symusic import Score

    problem = not_a_file(prompt)
    if problem == "does not exist":
        raise FileNotFoundError(f"prompt file {prompt} does not exist")
    if problem:
        raise ValueError(f"prompt file {prompt} {problem}")
    try:
        score = Score(str(prompt))
    except Exception as err:  # noqa: BLE001 - symusic raises its own error types
        raise ValueError(f"cannot read prompt MIDI {prompt}: {' '.join(str(err).split())}") from None
    if bars == 0:
        return []
    pitched = score.copy()
    pitched.tracks = [t for t in pitched.tracks if not t.is_drum]
    try:
        ids = _first_bars(tokenizer, pitched, bars)
    except Exception as err:  # noqa: BLE001 - MidiTok raises its own error types
        raise ValueError(f"cannot tokenise prompt MIDI {prompt}: {' '.join(str(err).split())}") from None
    pitch_ids = {i for token, i in tokenizer.vocab.items() if token.startswith("Pitch_")}
    if not any(t in pitch_ids for t in ids):
        raise _no_usable_notes(prompt, score, tokenizer, bars)
    drums = [t for t in score.tracks if t.is_drum and len(t.notes)]
    if drums:
        warnings.warn(f"prompt {prompt}: left out its {sum(len(t.notes) for t in drums)} drum notes "
                      f"({len(drums)} drum track{'s' if len(drums) > 1 else ''})", stacklevel=2)
    return ids


def _first_bars(tokenizer, score, bars: int) -> list[int]:
    """The ids of ``score`` tokenised whole and cut before its bar ``bars`` (0-based; all of
    them if it has no such bar), from a tokenisation of its first bars only.

    The score is clipped to [0, T) and a sentinel note put at T − 1 before tokenising: the
    notes before T keep their whole durations, and the sentinel makes MidiTok write every
    bar up to T, so once bar ``bars`` starts before T (its Bar token is there) everything
    before it is what the whole file gives, and the sentinel comes after it. T starts at the
    end of bar ``bars`` by the file's time signatures, and doubles while MidiTok's bar
    ``bars`` is not reached (its bars differ where it does not know a signature).
    """
    from spe.lab.music.evaluation.music_prompt import bar_count, bar_start

    bar_id = tokenizer.vocab["Bar_None"]
    # past the file's last bar the limit is its end: walking 10^9 bars to find that took minutes
    limit = max(bar_start(score, min(bars, bar_count(score)) + 1), 1)
    while True:
        whole = score.end() <= limit
        ids = list(tokenizer.encode(score if whole else _clip_with_sentinel(score, limit, tokenizer)).ids)
        starts = [i for i, t in enumerate(ids) if t == bar_id]
        if len(starts) > bars:
            return ids[:starts[bars]]
        if whole:
            return ids
        limit *= 2


def _clip_with_sentinel(score, limit: int, tokenizer):
    from symusic import Note, Track

    clipped = score.clip(0, limit)  # notes starting before the limit, whole
    programs = sorted(p for p in tokenizer.config.programs if p >= 0)  # MidiTok: -1 is drums
    sentinel = Track(program=programs[0] if programs else 0)
    sentinel.notes.append(Note(limit - 1, 1, tokenizer.config.pitch_range[0], 64))
    clipped.tracks.append(sentinel)
    return clipped


def _no_usable_notes(prompt, score, tokenizer, bars: int) -> ValueError:
    """Why the first ``bars`` bars of ``score`` give no pitched note, as a ValueError."""
    low, high = tokenizer.config.pitch_range  # high excluded
    notes = [t.notes.numpy() for t in score.tracks if not t.is_drum and len(t.notes)]
    drums = sum(len(t.notes) for t in score.tracks if t.is_drum)
    if not notes and not drums:
        return ValueError(f"prompt {prompt} holds no notes")
    if not notes:
        return ValueError(f"prompt {prompt} holds drum notes only ({drums} notes), which prompts leave out: "
                          "give a prompt with pitched notes")
    pitch = np.concatenate([n["pitch"] for n in notes]).astype(int)
    time = np.concatenate([n["time"] for n in notes])
    inside = (pitch >= low) & (pitch < high)
    if not inside.any():
        return ValueError(f"prompt {prompt}: no notes within the tokenizer's pitch range {low}–{high - 1} "
                          f"(found {pitch.size} notes, pitches {pitch.min()}–{pitch.max()})")
    return ValueError(f"prompt {prompt}: its first {bars} bar{'s' if bars > 1 else ''} (--prompt-bars {bars}) hold "
                      f"no note the tokenizer keeps; its first note within the pitch range {low}–{high - 1} starts "
                      f"at quarter note {time[inside].min() / score.tpq:g}")


def generate_midi(checkpoint: str | os.PathLike | LoadedCheckpoint, out: str, *, length: int, prompt: str | None,
                  prompt_bars: int, seed: int, top_p: float, temperature: float, device: str = "cpu",
                  progress: bool = False, window: int | None = None) -> dict:
    """Samples a continuation with the REMI grammar mask and writes it as MIDI (atomically).

    Args:
        checkpoint: run folder, ``.safetensors`` file or loaded checkpoint trained on music.
        out: the ``.mid``/``.midi`` file to write.
        length: tokens to generate after the prompt (may exceed the training length).
        prompt: MIDI file whose first ``prompt_bars`` bars start the piece, or None.
        prompt_bars: bars of the prompt kept.
        seed: sampling seed.
        top_p: nucleus mass in (0, 1].
        temperature: softmax temperature (> 0).
        device: where a path is loaded.
        progress: progress bar.
        window: sliding attention window (0: the whole past; None: as trained).

    Returns:
        ``out``, ``prompt_tokens``, ``generated_tokens``, ``total_tokens``, ``notes``,
        ``beats`` (quarter notes), ``bars`` and ``training_length`` (tokens).

    Raises:
        FileNotFoundError: if the checkpoint or the prompt does not exist.
        ValueError: on a non-positive length, an ``out`` that is not a MIDI file name, a
            checkpoint without tokenizer, or an unreadable prompt.
    """
    from spe.lab.music.grammar import REMIGrammar
    from spe.lab.music.corpus import tokenizer_from_json

    if length < 1:
        raise ValueError(f"length must be a positive number of tokens, got {length}")
    if not str(out).lower().endswith((".mid", ".midi")):
        raise ValueError(f"out must name a .mid or .midi file, got {out}")
    check_output_file(out, "--out", reads=[getattr(checkpoint, "path", checkpoint), prompt])
    loaded = checkpoint if isinstance(checkpoint, LoadedCheckpoint) else load(checkpoint, device=device)
    loaded.set_window(window)
    if loaded.tokenizer_json is None:
        raise ValueError(f"{loaded.path} holds no tokenizer: it was not trained on music by `spe train`")
    tokenizer = tokenizer_from_json(loaded.tokenizer_json)
    loaded.check_length(length, f"--length {length}")
    start = prompt_ids(tokenizer, prompt, prompt_bars) if prompt else []
    if start:
        loaded.check_length(len(start) + length,
                            f"the prompt {prompt} ({len(start)} tokens) plus --length {length}")
    ids = generate(loaded.model, start, length, top_p=top_p, temperature=temperature,
                   allowed_next=REMIGrammar(tokenizer).allowed_next, generator=torch.Generator().manual_seed(seed),
                   progress=progress)
    score = tokenizer.decode(ids)
    atomic_write(out, lambda tmp: score.dump_midi(tmp))
    return {"out": str(out), "prompt_tokens": len(start), "generated_tokens": length, "total_tokens": len(ids),
            "notes": sum(len(t.notes) for t in score.tracks), "beats": score.end() / score.ticks_per_quarter,
            "bars": sum(1 for t in ids if t == tokenizer.vocab["Bar_None"]),
            "training_length": loaded.train_config.get("seq_len")}
