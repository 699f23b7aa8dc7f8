"""The study's rules, stated once: mean ± sample std, the best row, one-sided Welch tests, the best
group and the rows that need more seeds (docs/study-rules.md, "How the study is computed").

Every number a study table prints about selection comes from :func:`select`:

* **Spread.** Per row, the mean and the sample standard deviation (n − 1) of its per-seed
  values (:func:`spe.lab.stats.mean_and_std`).
* **Direction.** The metric says which way is better: ``cross_entropy`` (nats/token) lower,
  ``accuracy`` (a fraction) higher (:data:`METRICS`).
* **The best row.** The row with the best mean among rows of at least two seeds (a row of one
  seed has no spread and cannot be tested; it is shown, never chosen).
* **The test.** For every other row of at least two seeds, a one-sided Welch t-test
  (unequal variances; Welch 1947) of "the row is worse than the best":
  ``scipy.stats.ttest_ind(row, best, equal_var=False, alternative="greater")`` for a
  lower-is-better metric, ``alternative="less"`` for a higher-is-better one. Its p-value is
  the chance of a gap at least this large in the worse direction if the row were as good as
  the best.
* **The best group.** The best row and every tested row with p ≥ :data:`ALPHA` (0.05): the
  rows the data do not show to be worse than the best.
* **More seeds.** Holding both rows' spreads fixed, membership flips where the row's mean
  reaches the *flip mean* m* = m_best + d · t₀.₉₅(ν) · se (d = +1 lower-is-better, −1 higher;
  se = √(s_r²/n_r + s_b²/n_b), ν the Welch–Satterthwaite degrees of freedom). A row whose
  mean lies within one of its own standard deviations of m* (|m_r − m*| ≤ s_r), i.e. one
  seed's spread from the other side of the rule, needs 5 seeds (not where neither row varies:
  se = 0 settles the test by the means alone, e.g. two rows at 100 % on every seed); so does a
  row of one seed
  (untestable). Whenever any row needs them, the best row runs 5 seeds too, since every test
  involves it (:attr:`Selection.needs_seeds`).

The rules are applied to the **validation** split only (:data:`SELECTION_SPLIT`): rows,
repeats and best groups are chosen there; the test split is reported beside it and never
chosen on. scipy is imported when a test runs, not with this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spe.lab.stats import mean_and_std

__all__ = ["ALPHA", "METRICS", "MORE_SEEDS", "SELECTION_SPLIT", "RowTest", "Selection", "better",
           "flip_mean", "select", "top_rows", "welch_p"]

ALPHA = 0.05  # a row leaves the best group when the one-sided Welch test gives p < ALPHA
MORE_SEEDS = 5  # seeds of a row near the rule's threshold (and of the best row then)
SELECTION_SPLIT = "validation"  # the only split any choice is made on
METRICS = {"cross_entropy": "lower", "accuracy": "higher"}  # metric -> which way is better


def better(metric: str) -> str:
    """``"lower"`` or ``"higher"``: which way ``metric`` improves.

    Raises:
        ValueError: naming the metric and the known ones.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    return METRICS[metric]


def _welch_parts(row: Sequence[float], best: Sequence[float]) -> tuple[float, float]:
    """(se, ν): the Welch standard error of the difference of means and its Welch–Satterthwaite
    degrees of freedom (ν NaN when se = 0)."""
    vr, vb = mean_and_std(row)[1] ** 2 / len(row), mean_and_std(best)[1] ** 2 / len(best)
    se2 = vr + vb
    if se2 == 0:
        return 0.0, math.nan
    return math.sqrt(se2), se2 ** 2 / (vr ** 2 / (len(row) - 1) + vb ** 2 / (len(best) - 1))


def _check(values: Sequence[float], what: str) -> list[float]:
    values = [float(v) for v in values]
    if len(values) < 2:
        raise ValueError(f"{what} needs at least two values (seeds) for a Welch test, got {len(values)}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{what} holds a value that is not finite: {values}")
    return values


def welch_p(row: Sequence[float], best: Sequence[float], metric: str) -> float:
    """p-value of the one-sided Welch t-test that ``row`` is worse than ``best``.

    Args:
        row, best: per-seed values (at least two each, finite).
        metric: a key of :data:`METRICS` (which way is worse).

    Returns:
        p in [0, 1]. Where both rows have no spread (se = 0) the test degenerates: 0.0 if the
        row's mean is worse, 1.0 if better, 0.5 if equal (the limit of t = 0).

    Raises:
        ValueError: on an unknown metric, fewer than two values or a value that is not finite.
        ImportError: without scipy (``pip install scipy``; the ``lra`` and ``test`` extras hold it).
    """
    direction = better(metric)
    row, best = _check(row, "the row"), _check(best, "the best row")
    gap = mean_and_std(row)[0] - mean_and_std(best)[0]
    if _welch_parts(row, best)[0] == 0:
        worse = gap > 0 if direction == "lower" else gap < 0
        return 0.0 if worse else (0.5 if gap == 0 else 1.0)
    from scipy.stats import ttest_ind

    alternative = "greater" if direction == "lower" else "less"
    return float(ttest_ind(row, best, equal_var=False, alternative=alternative).pvalue)


def flip_mean(row: Sequence[float], best: Sequence[float], metric: str, *, alpha: float = ALPHA) -> float:
    """m*: the mean ``row`` would need for its Welch p-value against ``best`` to be exactly
    ``alpha``, its spread and count unchanged (se and ν depend on spreads only). A mean on the
    worse side of m* leaves the best group.

    Raises:
        ValueError, ImportError: as :func:`welch_p`.
    """
    direction = better(metric)
    row, best = _check(row, "the row"), _check(best, "the best row")
    se, dof = _welch_parts(row, best)
    m_best = mean_and_std(best)[0]
    if se == 0:
        return m_best
    from scipy.stats import t

    return m_best + (1 if direction == "lower" else -1) * float(t.ppf(1 - alpha, dof)) * se


@dataclass(frozen=True)
class RowTest:
    """One row under the rules.

    Attributes:
        name: the row.
        n: its seeds.
        mean, std: mean and sample std (n − 1) of its values (std NaN for one seed).
        p: the Welch p-value against the best; None for the best row itself and for a row of
            one seed (or any row when no row has two seeds).
        in_group: in the best group (the best row: True; an untested row: False).
        flip: the flip mean m* (:func:`flip_mean`), None where untested.
        near: within one of its standard deviations of m* (or untested), where either row
            varies: it needs :data:`MORE_SEEDS` seeds.
    """

    name: str
    n: int
    mean: float
    std: float
    p: float | None
    in_group: bool
    flip: float | None
    near: bool


@dataclass(frozen=True)
class Selection:
    """The rules applied to one bucket (or length) of one split.

    Attributes:
        metric: what was compared.
        best: the best row (None when no row has two seeds).
        rows: name -> :class:`RowTest`, in the order given.
        alpha: the test's level.
    """

    metric: str
    best: str | None
    rows: dict[str, RowTest]
    alpha: float = ALPHA

    @property
    def group(self) -> list[str]:
        """The best group, best first, then by mean (best to worst)."""
        members = (r for r in self.rows.values() if r.in_group)
        ranked = sorted(members, key=lambda r: _rank(r.mean, self.metric))
        return [r.name for r in ranked]

    @property
    def needs_seeds(self) -> list[str]:
        """Rows to run at :data:`MORE_SEEDS` seeds: rows near the threshold or of one seed, and the
        best row whenever there is any such row, in the order given."""
        near = {r.name for r in self.rows.values() if r.near and r.n < MORE_SEEDS}
        if near and self.best is not None and self.rows[self.best].n < MORE_SEEDS:
            near.add(self.best)
        return [name for name in self.rows if name in near]


def _rank(mean: float, metric: str) -> float:
    return mean if better(metric) == "lower" else -mean


def select(values: Mapping[str, Sequence[float]], metric: str, *, alpha: float = ALPHA) -> Selection:
    """Applies the rules (module docstring) to per-seed values of rows.

    Args:
        values: row -> its per-seed values on the selection split (validation), at least one
            finite value per row.
        metric: a key of :data:`METRICS`.
        alpha: the test's level (0 < alpha < 1).

    Returns:
        The :class:`Selection`. Ties for the best mean go to the row given first.

    Raises:
        ValueError: on an unknown metric, a row without values or with a value that is not
            finite, or alpha outside (0, 1).
        ImportError: without scipy, once a test is needed.
    """
    better(metric)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    stats = {}
    for name, vals in values.items():
        vals = [float(v) for v in vals]
        if not vals or not all(math.isfinite(v) for v in vals):
            raise ValueError(f"row {name!r} needs at least one finite value per seed, got {vals}")
        stats[name] = (vals, *mean_and_std(vals))
    testable = [name for name, (vals, _, _) in stats.items() if len(vals) >= 2]
    best = min(testable, key=lambda n: _rank(stats[n][1], metric)) if testable else None
    rows = {}
    for name, (vals, mean, std) in stats.items():
        if name == best:
            rows[name] = RowTest(name, len(vals), mean, std, None, True, None, False)
        elif best is None or len(vals) < 2:
            rows[name] = RowTest(name, len(vals), mean, std, None, False, None, True)
        else:
            p = welch_p(vals, stats[best][0], metric)
            flip = flip_mean(vals, stats[best][0], metric, alpha=alpha)
            # where neither row varies (se = 0) the test is settled by the means alone: no flip
            # mean to be near, and no spread to carry a seed across it
            spread = _welch_parts(vals, stats[best][0])[0] > 0
            rows[name] = RowTest(name, len(vals), mean, std, p, p >= alpha, flip,
                                 spread and abs(mean - flip) <= std)
    return Selection(metric, best, rows, alpha)


def top_rows(values: Mapping[str, Sequence[float]], metric: str, k: int) -> list[str]:
    """The ``k`` rows of best mean (best first), e.g. the rows a longer-budget run repeats; rows of
    one seed count too (their mean is all there is). Ties keep the order given.

    Raises:
        ValueError: on an unknown metric, k < 1 or a row without values.
    """
    better(metric)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    means = {name: mean_and_std(v)[0] for name, v in values.items()}
    return sorted(means, key=lambda n: _rank(means[n], metric))[:k]
