"""The Gradio page of ``spe app``: controls wired to :mod:`spe.lab.app.core`, nothing more.

Needs the ``app`` extra (Gradio). Every failure of a request is a message on the page.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

from spe.lab.app import core

__all__ = ["build_page", "require_gradio", "serve"]

log = logging.getLogger(__name__)

SOURCES = ("none", "an uploaded MIDI file", "a piece of the corpus")


def require_gradio():
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # the page calls no one
    try:
        import gradio
    except ModuleNotFoundError as err:
        raise ValueError(f"spe app needs Gradio ({err.name} is missing): pip install 'spe[app]'") from None
    return gradio


class _Models:
    """The models offered, each opened on first use."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = [str(p) for p in paths]
        self._open: dict[str, core.AppModel] = {}

    def get(self, path: str) -> core.AppModel:
        if path not in self.paths:
            raise ValueError(f"{path} is not one of the models this page offers")
        if path not in self._open:
            self._open[path] = core.open_model(path)
        return self._open[path]


def _generate(models: _Models, work: Path, model_path, source, upload, piece, bars, length, top_p, temperature,
              seed, progress=None):
    """(piano roll, audio, MIDI, message) for one click; a failure gives Nones and its message."""
    try:
        app = models.get(model_path)
        bars = int(bars)
        note = ""
        if source == SOURCES[1]:
            if not upload:
                raise ValueError("no prompt file: upload a MIDI file, or pick another prompt")
            prompt, note = core.upload_prompt(app, upload, bars)
        elif source == SOURCES[2]:
            prompt, note = core.corpus_prompt(app, piece, bars)
        else:
            prompt = []
        piece_ = core.generate_piece(app, prompt, work, length=length, top_p=float(top_p),
                                     temperature=float(temperature), seed=seed, progress=progress is not None)
        roll = core.piano_roll(piece_, piece_.midi.with_suffix(".png"))
        soundfont, why = core.find_soundfont()
        audio = None
        if soundfont is None:
            note = f"{note}; " if note else ""
            note += f"no audio: {why}"
        else:
            try:
                audio, left_out = core.render_wav(piece_.midi, piece_.midi.with_suffix(".wav"), soundfont)
                if left_out:
                    note = (f"{note}; " if note else "") + (
                        f"the audio leaves out {', '.join(left_out)}: the synthesizer hung on a note {soundfont.name} "
                        "has no sample for (SPE_SOUNDFONT may name a fuller General MIDI soundfont)")
            except ValueError as err:
                note = (f"{note}; " if note else "") + f"no audio: {err}"
        message = (f"{piece_.prompt_tokens} prompt tokens + {len(piece_.ids) - piece_.prompt_tokens} generated, "
                   f"{piece_.notes} notes, {piece_.score.end() / piece_.score.ticks_per_quarter:g} quarter notes"
                   + (f". {note[:1].upper()}{note[1:]}" if note else ""))
        return str(roll), (str(audio) if audio else None), str(piece_.midi), message
    except (ValueError, OSError) as err:
        return None, None, None, f"**Error:** {' '.join(str(err).split())}"
    except Exception as err:  # noqa: BLE001 - the page shows one line, never a traceback
        log.exception("spe app: generation failed")
        return None, None, None, f"**Error:** generation failed: {type(err).__name__}: {' '.join(str(err).split())}"


def _results(work: Path, model_path):
    """The run's extrapolation plot (copied into ``work``: the page serves no file of the run's
    folder) and its headline numbers."""
    try:
        png, text = core.run_results(model_path)
        if png is not None:
            png = Path(shutil.copy(png, work / f"extrapolation-{abs(hash(str(png.resolve())))}.png"))
    except Exception as err:  # noqa: BLE001 - a broken evaluation file is a message, not a failure
        return None, f"Cannot read the evaluation beside {model_path}: {' '.join(str(err).split())}"
    return (str(png) if png else None), text


def build_page(paths: list[Path], work: str | os.PathLike | None = None):
    """The page (a ``gradio.Blocks``) offering the models at ``paths``; generated files go to
    ``work`` (default: a new temporary folder)."""
    gr = require_gradio()
    models = _Models(paths)
    work = Path(work or tempfile.mkdtemp(prefix="spe-app-"))

    def generate(model_path, source, upload, piece, bars, length, top_p, temperature, seed,
                 progress=gr.Progress(track_tqdm=True)):  # noqa: B008 - how Gradio finds its progress bar
        return _generate(models, work, model_path, source, upload, piece, bars, length, top_p, temperature, seed,
                         progress)

    def results(model_path):
        return _results(work, model_path)

    # Gradio keeps a copy of each file shown: those over an hour old go, every hour
    with gr.Blocks(title="spe: listen to a model", delete_cache=(3600, 3600)) as page:
        gr.Markdown("## Listen to a model\nPick a model and a prompt, generate, look and listen.")
        with gr.Row():
            with gr.Column(scale=1):
                model = gr.Dropdown(models.paths, value=models.paths[0], label="model (run or export folder)")
                source = gr.Radio(list(SOURCES), value=SOURCES[0], label="prompt")
                upload = gr.File(label="prompt MIDI file", file_types=[".mid", ".midi"], type="filepath",
                                 elem_id="prompt-file")
                piece = gr.Number(value=0, precision=0, label="corpus piece (validation pieces of the run's data)")
                bars = gr.Slider(1, 16, value=2, step=1, label="prompt bars")
                length = gr.Slider(16, core.MAX_LENGTH, value=256, step=16, label="length (tokens)")
                top_p = gr.Slider(0.05, 1.0, value=0.9, step=0.05, label="top-p")
                temperature = gr.Slider(0.05, 3.0, value=1.2, step=0.05, label="temperature")
                seed = gr.Number(value=0, precision=0, label="seed")
                button = gr.Button("Generate", variant="primary", elem_id="generate")
            with gr.Column(scale=2):
                message = gr.Markdown(elem_id="message")
                roll = gr.Image(label="piano roll", type="filepath", elem_id="roll")
                audio = gr.Audio(label="listen", type="filepath", elem_id="audio")
                midi = gr.File(label="MIDI", elem_id="midi")
                with gr.Accordion("this run's evaluation", open=True):
                    plot = gr.Image(label="cross-entropy per position", type="filepath", elem_id="extrapolation")
                    numbers = gr.Markdown()
        button.click(generate, [model, source, upload, piece, bars, length, top_p, temperature, seed],
                     [roll, audio, midi, message], api_name="generate")
        upload.upload(lambda: SOURCES[1], None, source)  # a file just uploaded is the prompt meant
        model.change(results, [model], [plot, numbers], api_name="results")
        page.load(results, [model], [plot, numbers])
    return page


def serve(paths: list[Path], *, host: str = "127.0.0.1", port: int = 7860, block: bool = True):
    """Builds the page and serves it on ``host:port``; returns the page (launched) when not ``block``."""
    work = tempfile.mkdtemp(prefix="spe-app-")
    atexit.register(shutil.rmtree, work, True)
    page = build_page(paths, work)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Gradio's own requests to itself, one a start
    previous = {}
    if block and threading.current_thread() is threading.main_thread():  # signal handlers live there
        # Ctrl-C or a TERM removes the generated files at once: Gradio's shutdown that follows can
        # take longer than whoever stopped the app waits before it kills the process.
        def stop(signum, frame):
            shutil.rmtree(work, ignore_errors=True)
            raise KeyboardInterrupt

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        page.queue().launch(server_name=host, server_port=port, share=False, inbrowser=False, show_api=False,
                            prevent_thread_lock=not block, quiet=True,
                            max_file_size=16 * core.MAX_PROMPT_BYTES)
    finally:
        if block:  # served until Ctrl-C: the generated files go now, not only when the interpreter exits
            shutil.rmtree(work, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return page
