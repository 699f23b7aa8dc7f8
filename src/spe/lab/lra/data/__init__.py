"""Long Range Arena data (Tay et al. 2021): Text, Retrieval and Image loaders for the official
layouts, embedded proxies, and :func:`load_task` for all four tasks (ListOps lives in
:mod:`spe.lab.lra.data.listops`). Needs the ``lra`` extra for the Image proxy, ``music`` for the others."""

from spe.lab.lra.data.dataset import CLS_ID, PAD_ID, PairDataset, SequenceDataset, split_off
from spe.lab.lra.data.tasks import DEFAULT_LENGTHS, TASKS, load_task

__all__ = [
    "CLS_ID",
    "DEFAULT_LENGTHS",
    "PAD_ID",
    "TASKS",
    "PairDataset",
    "SequenceDataset",
    "load_task",
    "split_off",
]
