"""LRA Image: CIFAR-10 as sequences of 1,024 grey levels (32 × 32 pixels read row-major).

Letters: N = images, L = 1,024 pixels.

Layout (the "python version" of CIFAR-10, as unpacked): ``data_batch_1`` … ``data_batch_5``
and ``test_batch``, each a pickled dict with ``data`` (10,000 × 3,072 uint8: the red, green
and blue 32 × 32 planes, row-major) and ``labels`` (10,000 ints in 0–9); the keys are bytes
in the official files (Python 2 pickles) and may be str. Grey level = round(0.299 R +
0.587 G + 0.114 B) (ITU-R BT.601 luma, the weights of ``tf.image.rgb_to_grayscale`` that LRA uses).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import torch

from spe.lab.lra.data.dataset import CONTENT_OFFSET, SequenceDataset, compact_dtype, regular_file

__all__ = ["CIFAR_FILES", "LUMA_WEIGHTS", "grey_levels", "image_dataset", "load_cifar10", "read_cifar_batch"]

CIFAR_FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
LUMA_WEIGHTS = (0.299, 0.587, 0.114)
_LAYOUT = ("a folder with the CIFAR-10 python batches data_batch_1 … data_batch_5 and test_batch "
           "(pickled dicts with 'data' (N, 3072) uint8 and 'labels')")
# The batches hold numpy arrays; nothing else may be built while unpickling (a pickle can run code).
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch")
        return super().find_class(module, name)


def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Reads one CIFAR-10 python batch.

    Returns:
        data (N, 3072) uint8 (R, G, B planes), labels (N,) int64.

    Raises:
        FileNotFoundError: if the file is missing.
        ValueError: naming the file, if it is not a regular file or not such a pickle, its arrays
            have the wrong shape, or a label is not an integer in 0–9.
    """
    path = regular_file(path, "CIFAR-10", _LAYOUT)
    try:
        with open(path, "rb") as f:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
        raise ValueError(f"CIFAR-10: {path} is not a python batch ({err}); expected {_LAYOUT}") from None
    if not isinstance(batch, dict):
        raise ValueError(f"CIFAR-10: {path} holds a {type(batch).__name__}, not a dict; expected {_LAYOUT}")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise ValueError(f"CIFAR-10: {path} has keys {sorted(batch)}, missing 'data' or 'labels'")
    data, labels = np.asarray(batch["data"]), np.asarray(batch["labels"])
    # Casting first would turn 3.7 into 3 and "٣" into 3: only integers are labels.
    if labels.size and labels.dtype.kind not in "iu":
        raise ValueError(f"CIFAR-10: {path}: labels must be integers in 0–9, got {labels.dtype} values "
                         f"such as {labels.flat[0]!r}")
    labels = labels.astype(np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (data.shape[0],):
        raise ValueError(f"CIFAR-10: {path}: expected data (N, 3072) uint8 and N labels, got data "
                         f"{data.shape} {data.dtype} and labels {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"CIFAR-10: {path}: labels must be in 0–9, got {labels.min()}…{labels.max()}")
    return data, labels


def grey_levels(rgb: np.ndarray) -> np.ndarray:
    """(N, 3072) R, G, B planes → (N, 1024) grey levels 0–255 (uint8), BT.601 luma, rounded."""
    planes = rgb.reshape(-1, 3, 1024).astype(np.float64)
    grey = np.tensordot(planes, np.asarray(LUMA_WEIGHTS), axes=([1], [0]))
    return np.clip(np.rint(grey), 0, 255).astype(np.uint8)


def load_cifar10(folder: str | os.PathLike, *,
                 splits: tuple[str, ...] = ("train", "test")) -> dict[str, SequenceDataset]:
    """Reads CIFAR-10 as grey-level pixel sequences.

    Args:
        folder: holds the python batches (``cifar-10-batches-py``).
        splits: which of ``train`` (batches 1–5), ``test`` to read.

    Returns:
        split → :class:`SequenceDataset` with tokens (N, 1024) = grey level + 2 (vocab_size 258),
        every length 1,024, num_classes 10, grid (32, 32).

    Raises:
        FileNotFoundError, ValueError: as :func:`read_cifar_batch`, or if the folder is missing.
    """
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"CIFAR-10: no folder {root}; expected {_LAYOUT}")
    out = {}
    for split in splits:
        parts = [read_cifar_batch(root / name) for name in CIFAR_FILES[split]]
        grey = np.concatenate([grey_levels(data) for data, _ in parts])
        labels = torch.from_numpy(np.concatenate([labels for _, labels in parts]))
        out[split] = image_dataset(grey, labels, (32, 32), 10)
    return out


def image_dataset(levels: np.ndarray, labels: torch.Tensor, grid: tuple[int, int],
                  num_classes: int) -> SequenceDataset:
    """(N, Y·X) grey levels 0–255 → a :class:`SequenceDataset` of ids level + 2 (vocab 258), full lengths."""
    vocab = CONTENT_OFFSET + 256
    tokens = torch.from_numpy(levels.astype(np.int64) + CONTENT_OFFSET).to(compact_dtype(vocab))
    lengths = torch.full((levels.shape[0],), levels.shape[1], dtype=torch.long)
    return SequenceDataset(tokens, lengths, labels.long(), vocab, num_classes, grid)
