"""What the page of ``spe app`` does, as plain functions: open a model, make a prompt, generate,
draw the piano roll, render the audio, read the run's evaluation.

Needs the ``music`` extra (MidiTok, symusic, matplotlib); an exported folder also the ``hf``
extra. Every user error is a ``ValueError`` (or ``FileNotFoundError``) of one line, which the
page shows as a message.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spe.checkpoint import MODEL_FILE, load, load_metadata, max_positions
from spe.generation import check_sampling, generate
from spe.paths import not_a_file

__all__ = ["MAX_LENGTH", "MAX_PROMPT_BYTES", "AppModel", "Piece", "corpus_prompt", "find_models", "find_soundfont",
           "generate_piece", "open_model", "piano_roll", "render_wav", "run_results", "upload_prompt"]

# The longest generation the page asks for, in tokens: a few minutes of music, seconds on a CPU.
MAX_LENGTH = 4096
# The largest prompt file read, in bytes: MIDI files of whole symphonies stay under 1 MB.
MAX_PROMPT_BYTES = 4 * 1024 * 1024
# Audio sample rate, in Hz: enough for a General MIDI soundfont, half the size of 44.1 kHz.
SAMPLE_RATE = 22050
# Folders never searched for models (tools' and training's intermediate checkpoints).
_SKIPPED = {"checkpoints", "node_modules", "__pycache__", "site-packages"}


@dataclass(eq=False)  # hashed by identity: the corpus is cached per opened model
class AppModel:
    """A music language model the page generates with.

    Attributes:
        path: the run folder (or its ``.safetensors``) or the export folder.
        kind: ``run`` (``spe train``'s) or ``export`` (``spe export``'s).
        model: the :class:`~spe.models.DecoderLM`, in eval mode.
        tokenizer: its MidiTok tokenizer.
        train_config: the run's training options (empty for an export).
        label: a one-line description.
        tokenizer_json: the tokenizer as the checkpoint stores it (a run's corpus is read with it).
    """

    path: Path
    kind: str
    model: Any
    tokenizer: Any
    train_config: dict = field(default_factory=dict)
    label: str = ""
    tokenizer_json: str = ""

    @property
    def max_length(self) -> int | None:
        """The most positions the model takes (None: any)."""
        return max_positions(self.model.config)


@dataclass
class Piece:
    """A generated piece: ``ids`` (prompt then new tokens), its ``score`` (symusic), the
    ``midi`` file written, ``prompt_tokens``, ``prompt_end`` (tick where the continuation
    starts) and ``notes``."""

    ids: list[int]
    score: Any
    midi: Path
    prompt_tokens: int
    prompt_end: int
    notes: int


def _is_export(folder: Path) -> bool:
    try:
        return json.loads((folder / "config.json").read_text()).get("model_type") == "spe"
    except (OSError, ValueError, AttributeError):
        return False


def _is_music_run(path: Path) -> bool:
    try:
        metadata = load_metadata(path)
    except (OSError, ValueError):
        return False
    return metadata.get("model_kind") == "decoder-lm" and bool(metadata.get("tokenizer"))


def find_models(root: str | os.PathLike = ".", *, max_depth: int = 5, limit: int = 100) -> list[Path]:
    """Run folders of music models and export folders under ``root``, sorted.

    Hidden folders, ``checkpoints/`` (a run's intermediate steps) and package folders are not
    searched; the search stops at ``max_depth`` levels and ``limit`` models.
    """
    root = Path(root)
    found = []
    for folder, dirs, files in os.walk(root):
        depth = len(Path(folder).relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIPPED and depth < max_depth)
        here = Path(folder)
        if MODEL_FILE in files and (_is_export(here) and "tokenizer.json" in files or _is_music_run(here)):
            found.append(here)
            if len(found) >= limit:
                break
    return sorted(found)


def open_model(path: str | os.PathLike, *, device: str = "cpu") -> AppModel:
    """Opens a music run (folder or ``.safetensors``) or an ``spe export`` folder.

    Raises:
        FileNotFoundError: if there is nothing at ``path``.
        ValueError: naming ``path``: not a music language model (an ``spe lra`` classifier, a
            run without tokenizer), an unusable checkpoint, or an export without
            ``tokenizer.json`` or without transformers installed.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: give a run folder or an spe export folder")
    if path.is_dir() and _is_export(path):
        return _open_export(path, device)
    loaded = load(path, device=device)
    if loaded.metadata["model_kind"] != "decoder-lm" or loaded.tokenizer_json is None:
        raise ValueError(f"{path} is not a music language model (no REMI tokenizer): give a run of spe train "
                         "or its spe export folder")
    from spe.lab.music.corpus import tokenizer_from_json
    from spe.lab.labels import run_label

    loaded.model.eval()
    return AppModel(path, "run", loaded.model, tokenizer_from_json(loaded.tokenizer_json), loaded.train_config,
                    f"{run_label(loaded.config)}, step {loaded.step}", loaded.tokenizer_json)


def _open_export(folder: Path, device: str) -> AppModel:
    if not (folder / "tokenizer.json").is_file():
        raise ValueError(f"{folder} is an export without tokenizer.json: it holds no music model")
    try:
        from spe.hf import SPEForCausalLM
    except ModuleNotFoundError as err:
        raise ValueError(f"{folder} is an spe export, which needs transformers ({err.name} is missing): "
                         "pip install 'spe[hf]'") from None
    from miditok import REMI

    from spe.lab.labels import run_label

    try:
        model = SPEForCausalLM.from_pretrained(folder).model.to(device).eval()
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise ValueError(f"cannot open the export {folder}: {' '.join(str(err).split())}") from None
    return AppModel(folder, "export", model, REMI(params=folder / "tokenizer.json"), {},
                    f"{run_label(model.config)}, exported")


def _allowed_next(app: AppModel):
    """The REMI grammar's mask, widened to the model's vocabulary: an export's MidiTok REMI
    lacks the run's ``Track_k`` ids, which stay disallowed."""
    from spe.lab.music.grammar import REMIGrammar

    grammar = REMIGrammar(app.tokenizer)
    vocab = app.model.config.vocab_size

    def allowed(seq: list[int]) -> torch.Tensor:
        mask = grammar.allowed_next(seq)
        if mask.numel() < vocab:
            mask = torch.cat([mask, mask.new_zeros(vocab - mask.numel())])
        return mask

    return allowed


def upload_prompt(app: AppModel, path: str | os.PathLike, bars: int) -> tuple[list[int], str]:
    """The REMI ids of the first ``bars`` bars of an uploaded MIDI file, and a note (drums left
    out, or empty).

    Raises:
        ValueError: naming the file: empty, over :data:`MAX_PROMPT_BYTES`, not MIDI, or no note
            the tokenizer keeps (:func:`~spe.lab.music.generation.prompt_ids`).
    """
    from spe.lab.music.generation import prompt_ids

    name = Path(path).name
    if not_a_file(path) is None:
        size = Path(path).stat().st_size
        if size == 0:
            raise ValueError(f"the prompt {name} is empty: upload a MIDI file")
        if size > MAX_PROMPT_BYTES:
            raise ValueError(f"the prompt {name} is {size / 2**20:.1f} MiB, over the page's limit of "
                             f"{MAX_PROMPT_BYTES // 2**20} MiB: upload a shorter MIDI file")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = prompt_ids(app.tokenizer, path, bars)
    return ids, "; ".join(str(w.message) for w in caught)


@lru_cache(maxsize=4)
def _corpus(app: AppModel) -> list[np.ndarray]:
    from spe.lab.music.corpus import load_corpus, tokenizer_to_json
    from spe.lab.music.split import split_of_run

    if app.kind == "run":
        split = split_of_run(app.train_config, tokenizer_json=app.tokenizer_json)
        return list(split.val_pieces) or list(split.train_pieces)
    # an export records no training data: the default corpus, tokenised with its tokenizer
    return list(load_corpus(None, progress=False, tokenizer=tokenizer_to_json(app.tokenizer)).pieces)


def _whole(value, low: int, high: int) -> bool:
    """Whether ``value`` (a page's number: int, float or None) is a whole number in [low, high]."""
    return (not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
            and int(value) == value and low <= value <= high)


def corpus_prompt(app: AppModel, index: int, bars: int) -> tuple[list[int], str]:
    """The first ``bars`` bars of piece ``index`` of the run's validation pieces (an export's:
    the default corpus), and a note naming the piece.

    Raises:
        ValueError: if ``index`` is not a piece number, naming the range.
    """
    pieces = _corpus(app)
    if not _whole(index, 0, len(pieces) - 1):
        raise ValueError(f"corpus piece {index} does not exist: pick 0 to {len(pieces) - 1}")
    ids = [int(t) for t in pieces[int(index)]]
    bar = app.tokenizer.vocab["Bar_None"]
    starts = [i for i, t in enumerate(ids) if t == bar]
    if len(starts) > bars:
        ids = ids[:starts[bars]]
    return ids, f"corpus piece {int(index)} of {len(pieces)}: its first {min(bars, len(starts))} bars"


def generate_piece(app: AppModel, prompt: list[int], out_dir: str | os.PathLike, *, length: int, top_p: float,
                   temperature: float, seed: int, progress: bool = False) -> Piece:
    """Continues ``prompt`` by ``length`` tokens with the REMI grammar mask and writes the MIDI
    file in ``out_dir`` (a new name each time).

    Raises:
        ValueError: naming the value: ``length`` not in 1 … :data:`MAX_LENGTH` or over the
            model's position limit with the prompt, ``top_p`` or ``temperature`` out of range, a
            seed that is not a whole number.
    """
    if not _whole(length, 1, MAX_LENGTH):
        raise ValueError(f"length must be a whole number of tokens from 1 to {MAX_LENGTH}, got {length}")
    if not _whole(seed, 0, 2**63 - 1):
        raise ValueError(f"seed must be a whole number from 0 to 2^63 − 1, got {seed}")
    check_sampling(top_p=top_p, temperature=temperature, top_p_name="top-p")
    length, seed = int(length), int(seed)
    limit = app.max_length
    if limit is not None and len(prompt) + length > limit:
        raise ValueError(f"the prompt ({len(prompt)} tokens) plus length {length} needs {len(prompt) + length} "
                         f"positions but this model takes {limit}: lower the length")
    ids = generate(app.model, prompt, length, top_p=top_p, temperature=temperature, allowed_next=_allowed_next(app),
                   generator=torch.Generator().manual_seed(seed), progress=progress)
    score = app.tokenizer.decode(ids)
    prompt_end = app.tokenizer.decode(prompt).end() if prompt else 0
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    midi = out_dir / f"spe-seed{seed}-{len(list(out_dir.glob('spe-*.mid')))}.mid"
    score.dump_midi(str(midi))
    return Piece(ids, score, midi, len(prompt), int(prompt_end), sum(len(t.notes) for t in score.tracks))


def piano_roll(piece: Piece, png: str | os.PathLike) -> Path:
    """Draws the piece's notes (pitch over quarter notes), the prompt in grey and the
    continuation in blue, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    score = piece.score
    tpq = score.ticks_per_quarter
    fig, ax = plt.subplots(figsize=(10, 3.2), dpi=90)
    for track in score.tracks:
        for note in track.notes:
            colour = "0.6" if note.time < piece.prompt_end else "tab:blue"
            ax.broken_barh([(note.time / tpq, max(note.duration, 1) / tpq)], (note.pitch - 0.4, 0.8),
                           facecolors=colour)
    if piece.prompt_end:
        ax.axvline(piece.prompt_end / tpq, color="k", lw=0.8, ls="--")
    ax.set_xlabel("quarter notes (grey: prompt, blue: generated)")
    ax.set_ylabel("MIDI pitch")
    ax.set_xlim(0, max(score.end() / tpq, 1))
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return Path(png)


def find_soundfont() -> tuple[Path | None, str]:
    """A General MIDI soundfont: ``$SPE_SOUNDFONT``, a system one, else the one pretty_midi
    ships (``TimGM6mb.sf2``); None and why when there is none."""
    from spe.lab.music.evaluation.audio import find_soundfont as system_soundfont

    path, why = system_soundfont()
    if path is not None or os.environ.get("SPE_SOUNDFONT"):
        return path, why
    spec = importlib.util.find_spec("pretty_midi")
    if spec is not None and spec.origin:
        shipped = Path(spec.origin).parent / "TimGM6mb.sf2"
        if shipped.is_file():
            return shipped, ""
    return None, f"{why}, and pretty_midi (which ships one) is not installed: pip install 'spe[app]'"


# The child that renders. FluidSynth (pyfluidsynth, through pretty_midi) when it loads, else
# symusic's synthesizer a track at a time, its index printed first: that synthesizer can loop
# forever on a note its soundfont has no sample for (TimGM6mb's program 21 at pitch 101), which no
# thread of this process could stop; the parent then renders again without that track.
_RENDER = """
import sys
import numpy as np
from symusic import Score, Synthesizer
from symusic.core import dump_wav
soundfont, midi, wav, rate, skip = sys.argv[1:6]
rate, skip = int(rate), {int(i) for i in skip.split(",") if i}
try:
    import fluidsynth  # noqa: F401 - pyfluidsynth, which loads the system's libfluidsynth
    import pretty_midi
except (ImportError, OSError):
    pretty_midi = None
if pretty_midi is not None:
    mono = pretty_midi.PrettyMIDI(midi).fluidsynth(fs=rate, synthesizer=soundfont).astype(np.float32)
    mix = np.stack([mono, mono])
else:
    score, synth = Score(midi), Synthesizer(soundfont, sample_rate=rate)
    mix = np.zeros((2, 0), np.float32)
    for i, track in enumerate(score.tracks):
        if i in skip or not len(track.notes):
            continue
        print(i, flush=True)
        one = score.copy()
        one.tracks = [track]
        try:
            audio = np.asarray(synth.render(one, stereo=True), np.float32)
        except TypeError:
            sys.exit("symusic 0.6.0 cannot hand back rendered audio and FluidSynth is not there: pip install "
                     "'symusic!=0.6.0', or pyfluidsynth with the system's libfluidsynth")
        if audio.shape[1] > mix.shape[1]:
            mix = np.pad(mix, ((0, 0), (0, audio.shape[1] - mix.shape[1])))
        mix[:, :audio.shape[1]] += audio
mix /= max(1.0, float(np.abs(mix).max(initial=0.0)))  # many instruments at once: scaled, not clipped
dump_wav(wav, np.asfortranarray(mix), rate, True)
"""


def render_wav(midi: str | os.PathLike, wav: str | os.PathLike, soundfont: str | os.PathLike, *,
               timeout: float | None = None) -> tuple[Path, list[str]]:
    """Renders the MIDI file ``midi`` with ``soundfont`` to a 16-bit stereo WAV file at
    :data:`SAMPLE_RATE` (scaled down where it would clip): with FluidSynth where pyfluidsynth
    and the system's libfluidsynth load, else with symusic's synthesizer.

    The synthesizer runs in a child process stopped after ``timeout`` seconds (default: 5 s
    plus an eighth of the music's duration); a track it hangs on is left out and the rest
    rendered again.

    Returns:
        The WAV file and the tracks left out (``program P``, empty when none).

    Raises:
        ValueError: naming the soundfont: the synthesizer failed (an unreadable soundfont;
            no FluidSynth and a symusic whose build cannot hand back audio, 0.6.0's).
    """
    from symusic import Score

    score = Score(str(midi))
    if timeout is None:
        timeout = 5 + score.to("second").end() / 8
    skipped: list[int] = []
    while True:
        command = [sys.executable, "-c", _RENDER, str(soundfont), str(midi), str(wav), str(SAMPLE_RATE),
                   ",".join(map(str, skipped))]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as err:
            out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
            started = out.split()
            if not started:  # FluidSynth, or the soundfont's loading, took all the time
                raise ValueError(f"the synthesizer did not finish within {timeout:.0f} s with the soundfont "
                                 f"{soundfont}") from None
            skipped.append(int(started[-1]))
            continue
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
            raise ValueError(f"the synthesizer failed with the soundfont {soundfont}: {lines[-1]}")
        return Path(wav), [f"program {score.tracks[i].program}" for i in skipped]


def _evaluation_folders(run: Path) -> list[Path]:
    """Where ``spe evaluate``, ``spe demo`` and ``spe sweep`` put a run's evaluation, nearest first."""
    siblings = sorted(run.parent.glob(f"{run.name}-evaluation*")) if run.name else []
    return [run / "evaluation", *siblings, run.parent / "evaluation", Path("runs") / "evaluation"]


def _same_run(checkpoint: str, run: Path) -> bool:
    path = Path(checkpoint).resolve()
    return run.resolve() in (path, path.parent if path.suffix == ".safetensors" else path)


def run_results(path: str | os.PathLike) -> tuple[Path | None, str]:
    """The run's extrapolation plot and its headline numbers (Markdown), from the first
    evaluation beside it whose ``summary.json`` names it; None and a hint when there is none."""
    run = Path(path)
    run = run.parent if run.suffix == ".safetensors" else run
    for folder in _evaluation_folders(run):
        try:
            summary = json.loads((folder / "summary.json").read_text())
            row = next(m for m in summary["models"] if _same_run(m["checkpoint"], run))
            numbers = (f"**{row['label']}**, step {row['step']}, trained at {row['seq_len']} tokens; evaluated on "
                       f"{summary['num_sequences']} {summary.get('split', 'validation')} sequences to "
                       f"{summary['max_length']} positions (`{folder}`):\n\n"
                       "| nats/token | within training length | beyond it | unigram |\n|---|---|---|---|\n"
                       f"| | {_nats(row['within'])} | {_nats(row['beyond'])} | {_nats(summary['unigram'])} |")
        except (OSError, ValueError, KeyError, TypeError, StopIteration):
            continue
        png = folder / "extrapolation.png"
        return (png if png.is_file() else None), numbers
    return None, (f"No evaluation of {run} found beside it: `spe evaluate {run} --out {run}-evaluation` "
                  "writes its extrapolation plot and numbers.")


def _nats(value) -> str:
    return "–" if value is None else f"{value:.3f}"
