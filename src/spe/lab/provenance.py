"""Where and how a run was made: the record every finished run keeps beside its numbers.

A run's ``result.json`` (:func:`spe.lab.plans.run_once`, the one place every task's runs are
finished: ``spe sweep``, ``spe lra``, ``spe synth``) holds ``provenance``:

* ``commit``: the git commit of the source tree the ``spe`` package was imported from, None when
  it is not a git checkout (an installed wheel: then ``version`` says which release);
  ``dirty``: whether files under the package's folder (tracked or untracked, not ignored) differed
  from that commit (None without git);
* ``config``: the run's resolved configuration as the task wrote it (every option, defaults
  included) and ``config_sha256``, the hash of its canonical JSON (sorted keys), which covers where
  the run was written (a music run's ``out``) and so differs between any two folders;
  ``experiment_sha256``, the same hash without :data:`RUN_ONLY_KEYS` and :data:`LOCATION_KEYS`
  (how and where the run was carried out: :func:`experiment_hash`): two runs with the same
  ``experiment_sha256`` were asked for the same experiment and seed, wherever they ran (records
  written before it existed lack it);
* ``threads`` (torch's intra-op threads when the run ended), ``device``, ``torch``, ``python``,
  ``cpu`` (the processor's model name), ``cpu_isa`` (the widest vector instruction set the
  processor reports: ``avx512``, ``avx2``, ...; :func:`cpu_isa`), ``cpu_capability`` (the one
  torch's own CPU kernels were dispatched to, ``torch.backends.cpu.get_cpu_capability()``),
  ``isa_limits`` (the environment variables that cap the instruction sets of torch, MKL and oneDNN,
  where set: :data:`ISA_LIMIT_VARIABLES`) and ``host``. Records written before the three ISA fields
  existed lack them. MKL's matrix products take their code path, hence their summation order, from
  the instruction set: the same commit, seed and thread count trained with MKL capped at AVX2 and
  uncapped on one AVX-512 processor give other weights (docs/study-rules.md), and the model name
  alone does not tell two processors apart (a virtual machine may report ``AMD EPYC`` for both);
* ``started`` and ``ended``: UTC times (ISO 8601, seconds) of the process that finished the run
  (a resumed run: of its last part).

Study data (:mod:`spe.lab.study_data`) copies each run's record, without its config, into the
study's meta, so that a table can say which rows' seeds ran on different commits.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ISA_LIMIT_VARIABLES", "LOCATION_KEYS", "PROVENANCE_KEYS", "RUN_ONLY_KEYS", "commit_of", "config_hash",
           "cpu_isa", "cpu_model", "experiment_hash", "isa_caps", "isa_limits", "provenance", "source_state", "utc"]

# The keys of a run's provenance record, in the order they are written (the module docstring).
PROVENANCE_KEYS = ("commit", "dirty", "version", "config_sha256", "experiment_sha256", "config", "threads", "device",
                   "torch", "python", "cpu", "cpu_isa", "cpu_capability", "isa_limits", "host", "started", "ended")
# Options that change how a run is carried out, not what it computes: a run folder may be continued
# with other values of them (spe lra, spe synth), and they stay out of experiment_sha256.
RUN_ONLY_KEYS = ("device", "tensorboard", "keep_checkpoints", "compile", "allow_data_change")
# Where a run writes and reads, and its thread count (recorded beside the hash as ``threads``).
LOCATION_KEYS = ("out", "cache_dir", "threads")
# Environment variables that lower the instruction set of torch's kernels (ATen), MKL and oneDNN, or
# fix MKL's code path across processors (MKL_CBWR: conditional numerical reproducibility).
ISA_LIMIT_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA",
                       "DNNL_MAX_CPU_ISA")
# x86 flags of /proc/cpuinfo, widest first, and the name cpu_isa gives each
_X86_ISAS = (("avx512f", "avx512"), ("avx2", "avx2"), ("avx", "avx"), ("sse4_2", "sse4.2"))
# The caps that make a wider processor follow a narrower one's code paths, where measured
# (docs/study-rules.md: on AVX-512 they gave an earlier machine's flip-flop numbers back; torch's
# own cap alone changed no bit there)
_CAPS = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}


def utc(seconds: float) -> str:
    """``seconds`` since the epoch as a UTC time in ISO 8601 to the second, e.g. ``2026-12-05T03:20:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def config_hash(config: Mapping) -> str:
    """The sha256 (hex) of ``config``'s canonical JSON: sorted keys, no spaces, non-ASCII kept."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def experiment_hash(config: Mapping) -> str:
    """:func:`config_hash` of ``config`` without its top-level :data:`RUN_ONLY_KEYS` and
    :data:`LOCATION_KEYS`: the same for two runs of one experiment and seed in different folders,
    on different devices or thread counts (which the record keeps beside it)."""
    return config_hash({k: v for k, v in config.items() if k not in RUN_ONLY_KEYS and k not in LOCATION_KEYS})


def _git(folder: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def source_state(folder: str | Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout holding ``folder``; (None, None) outside one.

    ``dirty`` is True when a tracked file under ``folder`` differs from the commit or an untracked,
    not ignored file lies there: either could change what the run computed (files elsewhere in the
    checkout, docs for instance, do not).
    """
    folder = Path(folder)
    commit = _git(folder, "rev-parse", "HEAD")
    if commit is None:
        return None, None
    changed = _git(folder, "status", "--porcelain", "--untracked-files=all", "--", ".")
    return commit.strip(), None if changed is None else bool(changed.strip())


@functools.cache
def commit_of() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the source tree the ``spe`` package was imported from (once per process:
    a run records the code it started with)."""
    import spe

    return source_state(Path(spe.__file__).resolve().parent)


@functools.cache
def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``'s ``model name`` on Linux), else
    :func:`platform.processor`, else the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_isa(cpuinfo: str | None = None) -> str:
    """The widest vector instruction set the processor reports: ``avx512``, ``avx2``, ``avx`` or
    ``sse4.2`` from the x86 ``flags`` of ``/proc/cpuinfo`` (or of ``cpuinfo``, its text), else the
    machine type (``aarch64``, ``arm64``, ...; also where ``/proc/cpuinfo`` cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return next((name for flag, name in _X86_ISAS if flag in flags), platform.machine())
    return platform.machine()


def isa_limits() -> dict[str, str]:
    """The :data:`ISA_LIMIT_VARIABLES` set in this process's environment, name -> value."""
    return {name: os.environ[name] for name in ISA_LIMIT_VARIABLES if name in os.environ}


def isa_caps(recorded: Mapping, running: Mapping) -> dict[str, str] | None:
    """The environment under which a rerun follows a recorded run's instruction sets, or None.

    Args:
        recorded, running: two provenance records (the committed run's, the rerun's).

    Returns:
        The recorded run's own ``isa_limits`` where it had some and the rerun's differ; else, where
        the recorded processor's ``cpu_isa`` is narrower than the rerun's and the caps that emulate
        it are known (AVX2 on an AVX-512 processor), those caps unless the rerun already had them;
        else None (the same instruction sets, a record without them, or no known caps: a narrower
        processor cannot follow a wider).
    """
    limits = recorded.get("isa_limits")
    if limits:
        return None if running.get("isa_limits") == limits else dict(limits)
    widths = [name for _, name in reversed(_X86_ISAS)]
    then, now = recorded.get("cpu_isa"), running.get("cpu_isa")
    if then not in _CAPS or now not in widths or widths.index(now) <= widths.index(then):
        return None
    return None if running.get("isa_limits") == _CAPS[then] else dict(_CAPS[then])


def provenance(*, started: float, ended: float, config: Mapping | None = None, device: str | None = None) -> dict:
    """A run's provenance record (module docstring).

    Args:
        started, ended: seconds since the epoch (``time.time()``).
        config: the run's resolved configuration (JSON-able); None: not known (no hash either).
        device: where it ran (default: the config's ``device``, else ``cpu``).

    Returns:
        A dict with the keys of :data:`PROVENANCE_KEYS`, in that order.
    """
    import torch

    import spe

    commit, dirty = commit_of()
    config = None if config is None else json.loads(json.dumps(config, default=str))
    device = device or (config or {}).get("device") or "cpu"
    return {"commit": commit, "dirty": dirty, "version": spe.__version__,
            "config_sha256": None if config is None else config_hash(config),
            "experiment_sha256": None if config is None else experiment_hash(config), "config": config,
            "threads": torch.get_num_threads(), "device": str(device), "torch": torch.__version__,
            "python": platform.python_version(), "cpu": cpu_model(), "cpu_isa": cpu_isa(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "isa_limits": isa_limits(),
            "host": platform.node(),
            "started": utc(started), "ended": utc(ended)}
