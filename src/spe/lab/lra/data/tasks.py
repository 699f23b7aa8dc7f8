"""One entry point for the four Long Range Arena tasks: a data folder in the official layout,
or None for the embedded data (generated ListOps; the Text, Retrieval and Image proxies).

Letters: N = examples, L = tokens per example.
"""

from __future__ import annotations

import os

from spe.lab.lra.data.dataset import PairDataset, SequenceDataset, split_off

__all__ = ["DEFAULT_LENGTHS", "TASKS", "load_task"]

TASKS = ("listops", "text", "retrieval", "image")
# LRA's lengths: ListOps up to 2,000 symbols without the binarising parentheses (None: the
# longest example), Text 1,000 bytes in LRA's code (4,000 in its paper), Retrieval 4,000 bytes per
# document, Image 32 × 32 pixels.
DEFAULT_LENGTHS = {"listops": None, "text": 1000, "retrieval": 4000, "image": 1024}


def load_task(task: str, data: str | os.PathLike | None = None, *, max_length: int | None = None,
              seed: int = 0, val_fraction: float = 0.1, cache_dir: str | os.PathLike | None = None,
              drop_parentheses: bool = False,
              listops_sizes: tuple[int, int, int] = (96_000, 2_000, 2_000),
              listops_options: dict | None = None,
              listops_pipeline: str = "lossless",
              ) -> dict[str, SequenceDataset | PairDataset]:
    """Loads one LRA task's train, val and test splits.

    Args:
        task: ``listops``, ``text``, ``retrieval`` or ``image``.
        data: the task's folder in its official layout (``basic_*.tsv``; ``aclImdb``;
            ``new_aan_pairs.*.tsv``; CIFAR-10 python batches), or None for the embedded data.
        max_length: L (default :data:`DEFAULT_LENGTHS`); ignored for images (always 1,024).
        seed: seeds the embedded data (ListOps generation, proxy splits) and the validation split.
        val_fraction: share of the training set held out per class where the task has no
            validation split (IMDB, CIFAR-10).
        cache_dir: where the generated ListOps splits are cached
            (see :func:`spe.lab.lra.data.listops.listops_folder`).
        drop_parentheses: ListOps only, see :class:`spe.lab.lra.data.listops.ListOpsTokenizer`.
        listops_sizes: train / val / test sizes of the generated ListOps (LRA's by default).
        listops_options: generator options of the embedded ListOps (``max_depth``,
            ``max_args``, ``min_length``, ``max_length``; see :func:`spe.lab.lra.data.listops.generate`),
            e.g. shorter expressions for a CPU-sized run; they name the cache folder.
        listops_pipeline: ListOps only: ``lossless`` (every symbol) or ``lra-2021`` (LRA's
            original words, no ``]`` and no parentheses; see :class:`spe.lab.lra.data.listops.ListOpsTokenizer`).

    Returns:
        ``{"train", "val", "test"}`` → :class:`SequenceDataset` (ListOps, Text, Image) or
        :class:`PairDataset` (Retrieval).

    Raises:
        ValueError: for an unknown task, a ListOps pipeline other than ``lossless`` for
            another task, an empty split (naming the task, the split, every split's size and,
            for a validation split held out of the training set, ``val_fraction``), and as the
            task's loader.
        FileNotFoundError: as the task's loader.
    """
    if task not in TASKS:
        raise ValueError(f"unknown LRA task {task!r}; choose from {', '.join(TASKS)}")
    length = DEFAULT_LENGTHS[task] if max_length is None else max_length
    if task != "listops" and listops_pipeline != "lossless":
        raise ValueError(f"listops_pipeline applies to ListOps only, got {listops_pipeline!r} for task {task!r}")
    if task == "listops":
        from spe.lab.lra.data.listops import listops_folder, load_listops

        if data is None:
            num_train, num_val, num_test = listops_sizes
            data = listops_folder(cache_dir, num_train=num_train, num_val=num_val, num_test=num_test,
                                  seed=seed, **(listops_options or {}))
        return _nonempty(task, load_listops(data, max_length=length, drop_parentheses=drop_parentheses,
                                            pipeline=listops_pipeline))
    from spe.lab.lra.data import proxies

    if data is None:
        embedded = {"text": lambda: proxies.text_proxy(max_length=length, seed=seed),
                    "retrieval": lambda: proxies.retrieval_proxy(max_length=length, seed=seed),
                    "image": lambda: proxies.image_proxy(seed=seed)}
        return _nonempty(task, embedded[task]())
    if task == "retrieval":
        from spe.lab.lra.data.retrieval import load_aan

        return _nonempty(task, load_aan(data, max_length=length))
    if task == "text":
        from spe.lab.lra.data.text import load_imdb

        splits = load_imdb(data, max_length=length)
    else:
        from spe.lab.lra.data.image import load_cifar10

        splits = load_cifar10(data)
    _nonempty(task, splits)
    train, val = split_off(splits["train"], val_fraction, seed=seed)
    sizes = splits["train"].labels.unique(return_counts=True)[1].tolist()
    return _nonempty(task, {"train": train, "val": val, "test": splits["test"]},
                     f"; val_fraction {val_fraction} holds out round({val_fraction} × n) of the n training "
                     f"examples of each class (n = {', '.join(map(str, sizes))})")


def _nonempty(task: str, splits: dict, note: str = "") -> dict:
    """``splits`` if none is empty (training, model selection and the test score need each).

    Raises:
        ValueError: naming the task, the empty split, every split's size and ``note``.
    """
    for name, split in splits.items():
        if len(split) == 0:
            sizes = ", ".join(f"{n} {len(s)}" for n, s in splits.items())
            split_name = "validation" if name == "val" else name
            raise ValueError(f"LRA {task}: the {split_name} split is empty ({sizes} examples){note}")
    return splits
