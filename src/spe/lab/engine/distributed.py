"""Data-parallel training across processes started by ``torchrun`` (``torch.distributed``, DDP).

``torchrun`` sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` in each process; :func:`setup`
reads them and joins the process group (``gloo`` on CPU, ``nccl`` on CUDA, one GPU per
local rank). Without them, or with ``WORLD_SIZE=1``, training runs in one process as before.

How the processes share a step (so that N processes with the global batch B match one
process with batch B up to float rounding):

* ``batch_size`` is the global batch: every process draws the same B crops from the same
  seeded generator and keeps its B/N slice (:func:`shard`);
* every process draws the same SPE code and FAVOR+ features from identically seeded
  generators (:func:`check_same` verifies it where it matters);
* DDP averages the gradients, which equals the gradient of the global mean loss because the
  slices have the same number of tokens;
* the logged loss and the validation cross-entropy are reduced over processes
  (:func:`all_sum`); only rank 0 writes files.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

__all__ = ["Distributed", "all_sum", "barrier", "check_same", "process_device", "session", "setup", "shard", "teardown"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Distributed:
    """Where this process stands in the group.

    Attributes:
        rank: global rank (0 writes files).
        world_size: number of processes N.
        local_rank: rank on this machine (selects the GPU).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def setup(device_type: str) -> Distributed:
    """Joins the process group when launched by ``torchrun`` (``WORLD_SIZE`` > 1).

    Args:
        device_type: ``cpu`` (gloo backend) or ``cuda`` (nccl; sets the device of the local rank).

    Raises:
        ValueError: if ``WORLD_SIZE`` > 1 but ``torch.distributed`` is unavailable, or the
            environment variables are malformed.
    """
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size <= 1:
        return Distributed()
    import torch.distributed as dist

    if not dist.is_available():
        raise ValueError(f"WORLD_SIZE={world_size} but this PyTorch build has no torch.distributed")
    ctx = Distributed(rank=_env_int("RANK", 0), world_size=world_size, local_rank=_env_int("LOCAL_RANK", 0))
    if device_type == "cuda":
        torch.cuda.set_device(ctx.local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
        log.info("process %d of %d (local rank %d, backend %s)", ctx.rank, ctx.world_size, ctx.local_rank,
                 dist.get_backend())
    return ctx


def teardown(ctx: Distributed) -> None:
    """Leaves the process group joined by :func:`setup`."""
    if ctx.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


@contextlib.contextmanager
def session(device_type: str) -> Iterator[Distributed]:
    """:func:`setup` … :func:`teardown`, leaving a process group that was joined before as it was.

    Nested calls (an LRA experiment around the runs of its seeds) share one group.
    """
    import torch.distributed as dist

    joined_before = dist.is_available() and dist.is_initialized()
    ctx = setup(device_type)
    try:
        yield ctx
    except BaseException:
        if not joined_before:
            teardown(ctx)
        raise
    if not joined_before:
        # A rank that leaves while another still talks to it resets the other's gloo connection,
        # which aborts that process (seen on a loaded 2-core machine); on success, leave together.
        try:
            barrier(ctx)
        finally:
            teardown(ctx)


def process_device(device: str | torch.device, ctx: Distributed) -> torch.device:
    """The device of this process: under torchrun a CUDA process takes the GPU of its local rank,
    whatever index ``device`` names; otherwise ``device`` itself."""
    if ctx.enabled and str(device).startswith("cuda"):
        return torch.device(f"cuda:{ctx.local_rank}")
    return torch.device(device)


def barrier(ctx: Distributed) -> None:
    """Waits for every process (a no-op in one process)."""
    if ctx.enabled:
        import torch.distributed as dist

        dist.barrier()


def shard(batch: torch.Tensor, ctx: Distributed) -> torch.Tensor:
    """This process's slice of a global (B, ...) batch: rows [r·B/N, (r+1)·B/N)."""
    if not ctx.enabled:
        return batch
    per_rank = batch.shape[0] // ctx.world_size
    return batch[ctx.rank * per_rank:(ctx.rank + 1) * per_rank]


def all_sum(values: list[float], ctx: Distributed, device: torch.device) -> list[float]:
    """Sums float values over processes (float64 on the wire, so sums do not lose digits)."""
    if not ctx.enabled:
        return list(values)
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def check_same(state: torch.Tensor, what: str, ctx: Distributed, device: torch.device) -> None:
    """Raises if a byte tensor (e.g. a generator state) differs between processes.

    A difference would mean different SPE codes or features per process, i.e. a silently
    different model; it is compared through a checksum's min and max over processes.

    Raises:
        RuntimeError: naming ``what`` if the processes disagree.
    """
    if not ctx.enabled:
        return
    import torch.distributed as dist

    weights = torch.arange(1, state.numel() + 1, dtype=torch.int64)
    checksum = int((state.to(torch.int64).flatten() * weights).sum() % (2**61 - 1))
    lo = torch.tensor([checksum], dtype=torch.int64, device=device)
    hi = lo.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    if int(lo) != int(hi):
        raise RuntimeError(f"{what} differs between the {ctx.world_size} processes (rank {ctx.rank}); "
                           "every process must draw the same SPE codes and features")
