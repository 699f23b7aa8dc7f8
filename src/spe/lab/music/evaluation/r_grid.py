"""The R ablation (Figure 14): cross-entropy of SPE models by trained and test-time realisations R."""

from __future__ import annotations

import numpy as np

__all__ = ["r_grids"]


def r_grids(records: list[dict]) -> list[dict]:
    """Groups R-ablation results into one grid per SPE family (Figure 14's layout).

    Args:
        records: one per (checkpoint, test R): ``family`` (e.g. "sinespe/performer"),
            ``trained`` (R at training), ``test`` (R at test), ``within`` and ``beyond``
            (mean cross-entropy, nats/token). Checkpoints of one family with the same trained
            R (e.g. seeds) are averaged.

    Returns:
        One dict per family, in order of appearance: ``label``, ``trained`` (sorted R),
        ``test`` (sorted R), ``within`` and ``beyond`` as (len(trained), len(test)) nested
        lists, NaN where nothing was measured; ``count`` gives the checkpoints averaged per cell.

    Raises:
        ValueError: if a record lacks a key.
    """
    needed = ("family", "trained", "test", "within", "beyond")
    families: dict[str, list[dict]] = {}
    for rec in records:
        missing = [k for k in needed if k not in rec]
        if missing:
            raise ValueError(f"R-ablation record {rec!r} lacks {', '.join(missing)}")
        families.setdefault(rec["family"], []).append(rec)
    grids = []
    for family, recs in families.items():
        trained = sorted({int(r["trained"]) for r in recs})
        test = sorted({int(r["test"]) for r in recs})
        grid = {"label": family, "trained": trained, "test": test}
        count = np.zeros((len(trained), len(test)))
        for key in ("within", "beyond"):
            total = np.zeros((len(trained), len(test)))
            count[:] = 0
            for r in recs:
                i, j = trained.index(int(r["trained"])), test.index(int(r["test"]))
                total[i, j] += r[key]
                count[i, j] += 1
            with np.errstate(invalid="ignore", divide="ignore"):
                grid[key] = np.where(count > 0, total / np.maximum(count, 1), np.nan).tolist()
        grid["count"] = count.astype(int).tolist()
        grids.append(grid)
    return grids
