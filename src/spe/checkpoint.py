"""Model checkpoints: weights in safetensors, configuration and metadata in its header.

Files are written to a temporary name in the same folder, flushed to disk (``fsync`` of the
file, then of the folder after the rename), and renamed, so after a crash or a power cut a
checkpoint is either the old one or the new one, never half-written. :func:`load` (the one
loader) reads a checkpoint once into a :class:`LoadedCheckpoint` (model, configuration, tokenizer, metadata) that
evaluation, generation, the report and the sweep pass around; ``load(path).model`` is the model.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from spe.encodings.registry import positional_spec
from spe.field_types import field_value_types
from spe.models.classifier_config import ClassifierConfig
from spe.models.config import ModelConfig, decode_window
from spe.models.decoder_lm import DecoderLM
from spe.models.encoder_classifier import EncoderClassifier
from spe.paths import not_a_file

__all__ = ["FORMAT_VERSION", "MODEL_FILE", "TRAIN_STATE_FILE", "LoadedCheckpoint", "atomic_write",
           "check_finite_weights", "fsync_dir", "load", "load_metadata", "max_positions",
           "save"]

MODEL_FILE = "model.safetensors"
# Optimizer step, optimizer and random states of a run, beside MODEL_FILE (see spe.lab.music.train).
TRAIN_STATE_FILE = "train_state.pt"
# The header's ``spe_model_kind`` names the model class (files without one hold decoders).
DEFAULT_MODEL_KIND = "decoder-lm"
MODEL_KINDS = {DEFAULT_MODEL_KIND: (ModelConfig, DecoderLM),
               EncoderClassifier.MODEL_KIND: (ClassifierConfig, EncoderClassifier)}
# Version of the checkpoint layout (header keys, tensor names). 1: the first versioned one;
# headers without a version were written before and read as version 1. A newer version is
# refused with a message rather than misread.
FORMAT_VERSION = 1
# mkstemp creates files readable by their owner only; written files get the usual permissions.
_UMASK = os.umask(0)
os.umask(_UMASK)


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flushes a folder's entries (renames, new files) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write) -> None:
    """Calls ``write(tmp_path)``, flushes tmp_path to disk, renames it to ``path`` and flushes the folder.

    The temporary file lives in the same folder (so the rename is atomic); it is removed if
    ``write`` fails. After a crash at any moment ``path`` holds the old or the new content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def max_positions(config: ModelConfig) -> int | None:
    """The most positions a model of ``config`` takes (its encoding's
    :meth:`~spe.encodings.spec.PositionalSpec.max_positions`, e.g. ``max_positions`` for
    ``ape-learned``); None: any."""
    return config.position_limit


def _resolve(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / MODEL_FILE
    elif path.name == TRAIN_STATE_FILE or path.suffix == ".pt":
        raise ValueError(f"{path} is a training state (optimizer and random states), not a model: pass "
                         f"the run folder {path.parent} or its {MODEL_FILE}")
    problem = not_a_file(path)
    if problem == "does not exist":
        raise FileNotFoundError(f"no checkpoint at {path} (expected a {MODEL_FILE} file or a folder holding one)")
    if problem:
        raise ValueError(f"checkpoint {path} {problem} (expected a {MODEL_FILE} file or a folder holding one)")
    return path


def save(model: DecoderLM | EncoderClassifier, path: str | os.PathLike, *, metadata: dict | None = None) -> Path:
    """Writes the model's weights and configuration atomically; :func:`load` reads them back.

    Args:
        model: a :class:`~spe.DecoderLM` or :class:`~spe.models.EncoderClassifier`.
        path: a ``.safetensors`` file, or a folder (then ``folder/model.safetensors``).
        metadata: JSON-serialisable extras (e.g. the tokenizer's parameters, training step).

    Returns:
        The file written.
    """
    from safetensors.torch import save_file

    path = Path(path)
    if path.suffix != ".safetensors":
        path = path / MODEL_FILE
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        state.pop("head.weight", None)  # the same tensor as embed.weight
    header = {"spe_config": json.dumps(model.config.to_dict()), "spe_metadata": json.dumps(metadata or {}),
              "spe_format_version": str(FORMAT_VERSION),
              "spe_model_kind": getattr(model, "MODEL_KIND", DEFAULT_MODEL_KIND)}
    atomic_write(path, lambda tmp: save_file(state, tmp, metadata=header))
    return path


def _read_header(file: Path) -> tuple[dict, dict[str, tuple[int, ...]]]:
    """The header's string entries and every tensor's shape, read without loading a tensor."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            header = f.metadata() or {}
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types
        raise ValueError(f"{file} is not a readable safetensors file: {err}") from None
    return header, shapes


def _json_object(file: Path, header: dict, key: str, default: str) -> dict:
    try:
        value = json.loads(header.get(key, default))
    except ValueError as err:
        raise ValueError(f"{file}: header entry {key} is not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{file}: header entry {key} must be a JSON object, got {_short(value)} "
                         f"({type(value).__name__})")
    return value


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Metadata entries other modules read, and the JSON types they may have (None: absent or null).
_METADATA_TYPES = {"step": (int, type(None)), "train": (dict,), "tokenizer": (str, type(None)), "lra": (dict,)}
_JSON_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a JSON object",
               list: "a list", tuple: "a list", type(None): "null"}
# Entries of spe_metadata.train that loading reads back (the run's data, split and length).
_TRAIN_TYPES = {"data": (str, type(None)), "cache_dir": (str, type(None)), "seq_len": (int,),
                "val_fraction": (float, int), "split_seed": (int,), "max_piece_tokens": (int,),
                "test_min_tokens": (int,), "num_test_pieces": (int,)}


def _check_types(file: Path, values: dict, allowed_by_name: dict, where: str) -> None:
    """Raises ValueError naming the file, the entry and the value for a value of another JSON type."""
    for name, value in values.items():
        allowed = allowed_by_name.get(name)
        if allowed is None:
            continue  # unknown to this version: ignored (newer files), or checked by the config
        if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
            # a float field takes integers too: "a number" says both
            kinds = " or ".join(dict.fromkeys(_JSON_NAMES[t] for t in allowed if not (t is int and float in allowed)))
            raise ValueError(f"{file}: header {where}.{name} must be {kinds}, got {_short(value)} "
                             f"({type(value).__name__})")


def load_metadata(path: str | os.PathLike) -> dict:
    """Returns the metadata dict stored by :func:`save` (plus ``config`` and ``model_kind``).

    Every entry is type-checked (the configuration against its class's field types) before
    anything else reads it, so a hand-edited header gives one message rather than a traceback.

    Raises:
        FileNotFoundError: if there is no checkpoint there.
        ValueError: naming the file, the entry and the value, for a file that is not an spe
            checkpoint, a newer format, invalid JSON or a value of the wrong type.
    """
    file = _resolve(path)
    header, _ = _read_header(file)
    return _metadata(file, header)


def _metadata(file: Path, header: dict) -> dict:
    if "spe_config" not in header:
        raise ValueError(f"{file} is not an spe checkpoint (no spe_config in its header)")
    version = header.get("spe_format_version", "1")
    if not version.isdigit() or int(version) > FORMAT_VERSION:
        raise ValueError(f"{file} has checkpoint format version {version}, newer than the {FORMAT_VERSION} "
                         "this spe reads: upgrade spe to load it")
    meta = _json_object(file, header, "spe_metadata", "{}")
    _check_types(file, meta, _METADATA_TYPES, "spe_metadata")
    _check_types(file, meta.get("train", {}), _TRAIN_TYPES, "spe_metadata.train")
    if isinstance(meta.get("step"), int) and meta["step"] < 0:
        raise ValueError(f"{file}: header spe_metadata.step must be ≥ 0, got {meta['step']}")
    meta["config"] = _json_object(file, header, "spe_config", "{}")
    meta["model_kind"] = header.get("spe_model_kind", DEFAULT_MODEL_KIND)  # older files: decoders
    if meta["model_kind"] in MODEL_KINDS:
        config_class = MODEL_KINDS[meta["model_kind"]][0]
        _check_types(file, meta["config"], field_value_types(config_class), "spe_config")
    return meta


def _load_model(file: Path, config: dict, device: str | torch.device,
                kind: str = "decoder-lm") -> DecoderLM | EncoderClassifier:
    """Builds the model of ``config`` and loads the weights of ``file``.

    The configuration is checked against the tensor shapes in the file's header before
    anything is allocated: the model is first built on the ``meta`` device (shapes, no
    storage), so a header claiming a vocabulary of 10^12 is refused instead of allocated.
    """
    from safetensors.torch import load_file

    if kind not in MODEL_KINDS:
        raise ValueError(f"{file}: unknown model kind {kind!r} (this version reads {', '.join(MODEL_KINDS)})")
    config_class, model_class = MODEL_KINDS[kind]
    try:
        model_config = config_class.from_dict(config)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{file}: header spe_config: {err}") from None
    _check_shapes(file, model_config, model_class)
    model = model_class(model_config)
    state = load_file(str(file))
    check_finite_weights(file, state)
    if model_config.tie_embeddings:
        state["head.weight"] = state["embed.weight"]
    model.load_state_dict(state)
    return model.to(device).eval()


def check_finite_weights(file: str | os.PathLike, state: dict[str, torch.Tensor]) -> None:
    """Refuses weights holding NaN or ±inf (a run that diverged, a damaged file): a model
    built from them yields NaN logits, so sampling fails and cross-entropies are NaN.

    Args:
        file: the file ``state`` was read from, for the message.
        state: tensor name -> tensor, as read from the file.

    Raises:
        ValueError: naming the file, the first tensor by name with non-finite values, how
            many it holds, and how many other tensors hold some.
    """
    bad = {name: int((~torch.isfinite(t)).sum()) for name, t in sorted(state.items())
           if t.is_floating_point() and not bool(torch.isfinite(t).all())}
    if bad:
        name, count = next(iter(bad.items()))
        others = f" ({len(bad) - 1} other tensor{'s' if len(bad) > 2 else ''} too)" if len(bad) > 1 else ""
        raise ValueError(f"{file}: tensor {name} holds {count} non-finite value{'s' if count > 1 else ''} "
                         f"(NaN/inf) of {state[name].numel()}{others}: the checkpoint is unusable")


def _check_shapes(file: Path, model_config: ModelConfig, model_class) -> None:
    """Raises ValueError if the model of ``model_config`` does not have the tensors of ``file``.

    Compares names and shapes only: a skeleton on the ``meta`` device, and the shapes the
    safetensors header records. Each block holds tensors of its own, so a ``num_layers``
    above the file's tensor count is refused before the skeleton is built (a skeleton of
    10^9 blocks would take hours even without storage).
    """
    _, shapes = _read_header(file)
    if model_config.num_layers > len(shapes):
        raise ValueError(f"{file}: header spe_config.num_layers = {model_config.num_layers}, but the file "
                         f"holds {len(shapes)} tensors (every layer has its own): the header does not "
                         "describe these weights")
    try:
        with torch.device("meta"):
            skeleton = model_class(model_config)
    except (RuntimeError, OverflowError) as err:  # e.g. more than 2^63 elements
        reason = " ".join(str(err).split())
        raise ValueError(f"{file}: header spe_config describes tensors that cannot exist ({reason}): the "
                         "header does not describe these weights") from None
    if model_config.tie_embeddings and "embed.weight" in shapes:
        shapes = {**shapes, "head.weight": shapes["embed.weight"]}
    expected = {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}
    mismatch = _state_mismatch(expected, shapes)
    if mismatch:
        raise ValueError(f"{file}: its tensors do not match its configuration ({mismatch}"
                         f"{_suspects(model_config, expected, shapes)}): the weights come from another model")


def _suspects(model_config: ModelConfig, expected: dict, given: dict) -> str:
    """Names the configuration's sizes found in the first mismatched shape it gives but not in the file's."""
    if set(expected) != set(given):
        return ""
    name = next(k for k in sorted(expected) if expected[k] != given[k])
    sizes = [(name, getattr(model_config, name)) for name, kinds in field_value_types(type(model_config)).items()
             if kinds == (int,)]
    named = [f"{field} = {value}" for field, value in sizes if value in expected[name] and value not in given[name]]
    return f"; header spe_config: {', '.join(named)}" if named else ""


def _state_mismatch(expected: dict[str, tuple[int, ...]], given: dict[str, tuple[int, ...]]) -> str:
    """The first difference between two maps of tensor names to shapes, in words ("" if none)."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    shapes = [k for k in sorted(set(expected) & set(given)) if expected[k] != given[k]]
    if missing:
        return f"{len(missing)} tensor(s) missing, e.g. {missing[0]}"
    if unexpected:
        return f"{len(unexpected)} unexpected tensor(s), e.g. {unexpected[0]}"
    if shapes:
        k = shapes[0]
        return f"{k} has shape {given[k]}, the configuration gives {expected[k]}"
    return ""


@dataclass
class LoadedCheckpoint:
    """A checkpoint read once: the model and everything its run recorded (what :func:`load` returns).

    Attributes:
        path: what was asked for (run folder or ``.safetensors`` file), as given.
        model: the :class:`~spe.DecoderLM` (``model(tokens)`` maps (batch, length) ids to
            (batch, length, vocab_size) logits), or the class the header's ``spe_model_kind``
            names (an :class:`~spe.models.EncoderClassifier` for ``spe lra`` checkpoints), in
            eval mode.
        metadata: the header's metadata (``step``, ``val_loss``, ``tokenizer``, ``train``,
            ``config``, ``model_kind``), as :func:`load_metadata` returns it.
    """

    path: str
    model: DecoderLM | EncoderClassifier
    metadata: dict

    @property
    def config(self) -> ModelConfig:
        """The model configuration (the model's own, so test-time changes show)."""
        return self.model.config

    @property
    def train_config(self) -> dict:
        """The training options the run recorded (empty for models saved outside ``spe train``)."""
        return self.metadata.get("train", {})

    @property
    def seq_len(self) -> int:
        """Training length L in tokens (256, the default, when the run recorded none)."""
        return int(self.train_config.get("seq_len", 256))

    @property
    def step(self) -> int | None:
        """Optimizer steps the checkpoint has seen."""
        return self.metadata.get("step")

    @property
    def tokenizer_json(self) -> str | None:
        """The REMI tokenizer's parameters (JSON text), or None if the run was not on music."""
        return self.metadata.get("tokenizer")

    @property
    def max_length(self) -> int | None:
        """The most positions the model's positional encoding supports (``ape-learned``: its
        ``max_positions``; others their spec's limit), or None when any length works."""
        return max_positions(self.model.config)

    def check_length(self, length: int, what: str) -> None:
        """Raises ValueError naming ``what`` if ``length`` positions exceed :attr:`max_length`."""
        if self.max_length is not None and length > self.max_length:
            limit = positional_spec(self.model.config.positional).limit_text
            raise ValueError(f"{what} needs {length} positions but {self.path} takes {self.max_length} {limit}")

    def set_window(self, window: int | None) -> None:
        """Sets the model's sliding attention window: None keeps the trained one; otherwise
        :func:`spe.models.config.decode_window` decodes it (0: the whole past, W > 0: W positions).

        Raises:
            ValueError: if ``window`` is negative or not an int, or the model cannot take a
                window (score encodings), naming the checkpoint.
        """
        if window is None:
            return
        window = decode_window(window, "window")
        try:
            self.model.set_attention_window(window)
        except ValueError as err:
            raise ValueError(f"{self.path}: {err}") from None


def load(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> LoadedCheckpoint:
    """Reads a checkpoint written by :func:`save` once: its header and its weights.

    Args:
        path: the ``.safetensors`` file or the folder holding ``model.safetensors``.
        device: where to put the weights.

    Returns:
        A :class:`LoadedCheckpoint`: ``.model`` (in eval mode), ``.metadata``, ``.config``,
        ``.step``, ``.tokenizer_json`` (the REMI tokenizer of a music run, or None), ...

    Raises:
        FileNotFoundError: if there is no checkpoint there.
        ValueError: naming the file, if it is not an spe checkpoint, holds a newer format or
            non-finite weights, or its tensors do not fit its configuration.
    """
    file = _resolve(path)
    metadata = load_metadata(file)
    return LoadedCheckpoint(path=str(path), model=_load_model(file, metadata["config"], device, metadata["model_kind"]),
                            metadata=metadata)

