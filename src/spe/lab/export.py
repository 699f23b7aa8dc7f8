"""``spe export``: a run's model as a ``transformers`` folder, with its MidiTok tokenizer.

The folder holds what ``save_pretrained`` writes (``config.json``, ``model.safetensors``,
``generation_config.json``: :mod:`spe.hf`) and, for a music run, ``tokenizer.json`` written by
MidiTok's own ``save``, so ``AutoModelForCausalLM.from_pretrained(DIR)`` (after ``import
spe.hf``) and ``miditok.REMI.from_pretrained(DIR)`` open them without the lab.

MidiTok knows REMI but not the lab's :class:`~spe.lab.music.corpus.TrackREMI` (runs that keep
tracks sharing a program apart, the default): its tokenizer is written as MidiTok's REMI of the
same configuration, whose ids are TrackREMI's first ones, and the generation config suppresses
the ids MidiTok's REMI lacks (the ``Track_k`` tokens), so every generated id decodes; notes of
one program then decode into one track.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from spe.checkpoint import MODEL_FILE, load
from spe.lab.outputs import check_output_folder

__all__ = ["EXPORT_FILES", "export_run"]

# What an export folder holds: transformers' files, then MidiTok's (music runs only).
EXPORT_FILES = ("config.json", "generation_config.json", MODEL_FILE, "tokenizer.json")


def _run_folder(run: str | os.PathLike) -> Path:
    path = Path(run)
    return path if path.is_dir() else path.parent


def _check_out(out: Path, run: str | os.PathLike, overwrite: bool) -> None:
    """Refuses an ``out`` inside (or being) the run folder, a file, or a folder with files
    unless ``overwrite`` and it holds an earlier export (whose files are the only ones replaced)."""
    check_output_folder(out, "--out")
    folder, target = _run_folder(run).resolve(), out.resolve()
    if target == folder or folder in target.parents:
        raise ValueError(f"--out {out} is {'' if target == folder else 'inside '}the run folder {_run_folder(run)}: "
                         "choose a folder outside it (nothing was written)")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise ValueError(f"--out {out} is not empty: choose a new folder, or pass --overwrite to replace an "
                         "earlier export there (nothing was written)")
    try:
        model_type = json.loads((out / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if model_type != "spe":
        raise ValueError(f"--out {out} holds files but no earlier spe export (no config.json of model_type "
                         "'spe'): --overwrite replaces an export only; choose a new folder (nothing was written)")


def _transformers():
    try:
        import spe.hf
    except ModuleNotFoundError as err:
        raise ValueError(f"spe export needs transformers ({err.name} is missing): pip install 'spe[hf]'") from None
    return spe.hf


def _miditok_tokenizer(tokenizer_json: str):
    """The run's tokenizer as a MidiTok class (REMI for the lab's TrackREMI), and the ids of
    the run's vocabulary that tokenizer lacks."""
    from miditok import REMI

    from spe.lab.music.corpus import _VOICES_KEY, tokenizer_from_json

    tokenizer = tokenizer_from_json(tokenizer_json)
    if type(tokenizer) is REMI:
        return tokenizer, []
    config = tokenizer.config.copy()
    config.additional_params = {k: v for k, v in config.additional_params.items() if k != _VOICES_KEY}
    plain = REMI(tokenizer_config=config)
    if any(tokenizer.vocab.get(token) != i for token, i in plain.vocab.items()):
        raise ValueError(f"the run's tokenizer ({type(tokenizer).__name__}) does not number MidiTok's REMI tokens "
                         "as REMI does: it cannot be exported for MidiTok")
    return plain, sorted(set(tokenizer.vocab.values()) - set(plain.vocab.values()))


def export_run(run: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False) -> dict:
    """Writes the run's model as ``transformers`` files and its tokenizer as MidiTok's, in ``out``.

    Everything is checked (the checkpoint, the folder, transformers installed) before anything
    is written, and the files are written in a hidden folder of ``out`` before any of
    ``out``'s own files is replaced.

    Args:
        run: a run folder or its ``model.safetensors`` (``spe train``'s; ``spe lra``'s
            classifiers too, without a tokenizer).
        out: the export folder: new, empty, or (with ``overwrite``) an earlier export.
        overwrite: replace an earlier export's files in ``out``.

    Returns:
        ``out``, ``files`` (names written), ``architecture`` (the transformers class),
        ``suppressed`` (ids the generation config suppresses) and ``step`` (the checkpoint's).

    Raises:
        FileNotFoundError: if there is no checkpoint at ``run``.
        ValueError: naming ``--out`` or the checkpoint: ``out`` inside the run folder, a file,
            not empty without ``overwrite`` (or not an export), an unusable checkpoint, or
            transformers not installed.
    """
    out = Path(out)
    loaded = load(run)  # first: a missing or unusable checkpoint is the message, whatever --out is
    _check_out(out, run, overwrite)
    hf = _transformers()
    if loaded.metadata["model_kind"] == "decoder-lm":
        model = hf.SPEForCausalLM.from_spe(loaded.model)
    else:
        model = hf.SPEForSequenceClassification.from_spe(loaded.model)
    tokenizer, suppressed = (None, []) if loaded.tokenizer_json is None else _miditok_tokenizer(loaded.tokenizer_json)
    if suppressed:
        model.generation_config.suppress_tokens = suppressed
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    # written whole in a hidden folder of out, then moved: a failure leaves an earlier export as it was
    tmp = Path(tempfile.mkdtemp(prefix=".export-", suffix=".tmp", dir=out))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save(tmp)  # MidiTok's own file: tokenizer.json
        files = sorted(p.name for p in tmp.iterdir())
        for name in files:
            os.replace(tmp / name, out / name)
        if tokenizer is None and (out / "tokenizer.json").exists():
            (out / "tokenizer.json").unlink()  # an earlier export's: not this model's
    except BaseException:
        shutil.rmtree(out if created else tmp, ignore_errors=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    return {"out": str(out), "files": files, "architecture": type(model).__name__, "suppressed": suppressed,
            "step": loaded.step}
