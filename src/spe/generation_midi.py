"""Generation to a MIDI file: a checkpoint, an optional MIDI prompt, nucleus sampling, a ``.mid`` out.

Needs the ``music`` extra (MidiTok, symusic). The sampling itself is :func:`spe.generation.generate`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from spe.checkpoint import LoadedCheckpoint, atomic_write, load_checkpoint
from spe.generation import generate

__all__ = ["generate_midi", "prompt_ids"]


def prompt_ids(tokenizer, prompt: str | os.PathLike, bars: int) -> list[int]:
    """REMI ids of the first ``bars`` bars of a MIDI file (all of it if it has fewer bars).

    Raises:
        FileNotFoundError: if ``prompt`` does not exist.
        ValueError: if it cannot be read as MIDI.
    """
    from symusic import Score

    if not Path(prompt).is_file():
        raise FileNotFoundError(f"prompt file {prompt} does not exist")
    try:
        ids = list(tokenizer.encode(Score(str(prompt))).ids)
    except Exception as err:  # noqa: BLE001 - symusic and MidiTok raise their own error types
        raise ValueError(f"cannot read prompt MIDI {prompt}: {err}") from None
    bar_id = tokenizer.vocab["Bar_None"]
    starts = [i for i, t in enumerate(ids) if t == bar_id]
    return ids[:starts[bars]] if len(starts) > bars else ids


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
    from spe.data.grammar import REMIGrammar
    from spe.data.music import tokenizer_from_json

    if length < 1:
        raise ValueError(f"length must be a positive number of tokens, got {length}")
    if not str(out).lower().endswith((".mid", ".midi")):
        raise ValueError(f"out must name a .mid or .midi file, got {out}")
    loaded = checkpoint if isinstance(checkpoint, LoadedCheckpoint) else load_checkpoint(checkpoint, device=device)
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
