"""WAV renderings of MIDI files with FluidSynth and a General MIDI soundfont, when both are installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from spe.checkpoint import atomic_write

__all__ = ["SOUNDFONTS", "find_soundfont", "render_audio"]

SOUNDFONTS = ("/usr/share/sounds/sf2/FluidR3_GM.sf2", "/usr/share/soundfonts/default.sf2")


def find_soundfont() -> tuple[Path | None, str]:
    """``$SPE_SOUNDFONT`` or the first of ``SOUNDFONTS`` that exists, else None and why not."""
    env = os.environ.get("SPE_SOUNDFONT")
    if env:
        return (Path(env), "") if Path(env).is_file() else (None, f"SPE_SOUNDFONT={env} is not a file")
    for candidate in SOUNDFONTS:
        if Path(candidate).is_file():
            return Path(candidate), ""
    return None, f"no General MIDI soundfont at {' or '.join(SOUNDFONTS)} and SPE_SOUNDFONT is not set"


def render_audio(midis: list[Path]) -> tuple[list[Path | None], str]:
    """WAV files beside the MIDI files, or Nones and the reason audio was skipped."""
    fluidsynth = shutil.which("fluidsynth")
    if fluidsynth is None:
        return [None] * len(midis), "skipped: `fluidsynth` is not on PATH"
    soundfont, why = find_soundfont()
    if soundfont is None:
        return [None] * len(midis), f"skipped: {why}"
    wavs, failures = [], []
    for midi in midis:
        wav = midi.with_suffix(".wav")

        def render(tmp: str, midi: Path = midi) -> None:
            # -T wav: the temporary name has no .wav suffix to infer the file type from.
            done = subprocess.run([fluidsynth, "-ni", "-T", "wav", "-F", tmp, "-r", "44100", str(soundfont),
                                   str(midi)], check=False, capture_output=True, text=True,
                                  timeout=600)
            if done.returncode != 0:
                raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else
                                   f"exit status {done.returncode}")

        try:
            atomic_write(wav, render)
            wavs.append(wav)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
            failures.append(f"{midi.name}: {err}")
            wavs.append(None)
    note = f"rendered to WAV with FluidSynth and {soundfont}"
    if failures:
        note += "; failed for " + "; ".join(failures)
    return wavs, note
