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
  (unequal variances; Welch 1947) of "the row is worse than the best", the value of
  ``scipy.stats.ttest_ind(row, best, equal_var=False, alternative="greater")`` for a
  lower-is-better metric, ``alternative="less"`` for a higher-is-better one. Its p-value is
  the chance of a gap at least this large in the worse direction if the row were as good as
  the best.
* **The best group.** The best row and every tested row that Holm's step-down procedure over the
  k tests against the best (Holm 1979) does not reject at :data:`ALPHA` (0.05): the rows the data
  do not show to be worse than the best, with the chance of wrongly putting any row out at most
  α over the k tests together (:func:`holm`; each row's Holm-adjusted p is
  :attr:`RowTest.p_holm`, its uncorrected p :attr:`RowTest.p`).
* **Stability.** :func:`leave_one_seed_out` recomputes the best group with each seed of each row
  (of at least two seeds) dropped in turn and counts the drops that change the group.
* **Equivalence.** :func:`equivalent`: two one-sided Welch tests (TOST, Schuirmann 1987) of
  "the two rows differ by at least the margin", each at α, and the 1 − 2α (90 %) interval of the
  difference; the margins are :data:`MARGINS`, one per metric.
* **More seeds.** On each test alone at α (the rule the runs followed, not Holm's thresholds,
  which move with every other row's p): holding both rows' spreads fixed, the test flips where
  the row's mean reaches the *flip mean* m* = m_best + d · t₀.₉₅(ν) · se (d = +1
  lower-is-better, −1 higher; se = √(s_r²/n_r + s_b²/n_b), ν the Welch–Satterthwaite degrees of
  freedom). A row whose mean lies within one of its own standard deviations of m*
  (|m_r − m*| ≤ s_r), i.e. one seed's spread from the other side of the rule, needs 5 seeds (not
  where neither row varies: se = 0 settles the test by the means alone, e.g. two rows at 100 %
  on every seed); so does a row of one seed (untestable). Whenever any row needs them, the best row runs 5 seeds too, since every test
  involves it (:attr:`Selection.needs_seeds`).

The rules are applied to the **validation** split only (:data:`SELECTION_SPLIT`): rows,
repeats and best groups are chosen there; the test split is reported beside it and never
chosen on. scipy is imported when a test runs, not with this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from spe.lab.stats import mean_and_std

__all__ = ["ALPHA", "MARGINS", "METRICS", "MORE_SEEDS", "SELECTION_SPLIT", "Equivalence", "RowTest", "Selection",
           "Stability", "better", "equivalent", "flip_mean", "holm", "leave_one_seed_out", "select", "top_rows",
           "welch_p"]

ALPHA = 0.05  # a row leaves the best group when the one-sided Welch test gives p < ALPHA
MORE_SEEDS = 5  # seeds of a row near the rule's threshold (and of the best row then)
SELECTION_SPLIT = "validation"  # the only split any choice is made on
METRICS = {"cross_entropy": "lower", "accuracy": "higher"}  # metric -> which way is better
# metric -> the equivalence margin of :func:`equivalent`: two rows whose true means differ by less
# are called equivalent. 0.02 nats is the gap the study's "within 0.02 nats" claims used; 2 points
# of accuracy (a fraction) the same for the synthetic tasks. Fixed here, not per comparison.
MARGINS = {"cross_entropy": 0.02, "accuracy": 0.02}


def better(metric: str) -> str:
    """``"lower"`` or ``"higher"``: which way ``metric`` improves.

    Raises:
        ValueError: naming the metric and the known ones.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    return METRICS[metric]


@lru_cache(maxsize=8192)
def _moments_of(values: tuple[float, ...]) -> tuple[float, float]:
    return mean_and_std(values)


def _moments(values) -> tuple[float, float]:
    """:func:`spe.lab.stats.mean_and_std`, remembered: its exact sums are slow, and the
    leave-one-seed-out check asks for the same rows' moments thousands of times."""
    return _moments_of(tuple(float(v) for v in values))


def _welch_parts(row: Sequence[float], best: Sequence[float]) -> tuple[float, float]:
    """(se, ν): the Welch standard error of the difference of means and its Welch–Satterthwaite
    degrees of freedom (ν NaN when se = 0)."""
    vr, vb = _moments(row)[1] ** 2 / len(row), _moments(best)[1] ** 2 / len(best)
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
    gap = _moments(row)[0] - _moments(best)[0]
    se, dof = _welch_parts(row, best)
    if se == 0:
        worse = gap > 0 if direction == "lower" else gap < 0
        return 0.0 if worse else (0.5 if gap == 0 else 1.0)
    # Student's t distribution function directly: the value of scipy.stats.ttest_ind(row, best,
    # equal_var=False, alternative="greater" / "less"), at a thousandth of its cost (the
    # leave-one-seed-out check runs thousands of tests)
    from scipy.special import stdtr

    return float(stdtr(dof, -gap / se if direction == "lower" else gap / se))


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
    m_best = _moments(best)[0]
    if se == 0:
        return m_best
    from scipy.special import stdtrit

    return m_best + (1 if direction == "lower" else -1) * float(stdtrit(dof, 1 - alpha)) * se


@dataclass(frozen=True)
class RowTest:
    """One row under the rules.

    Attributes:
        name: the row.
        n: its seeds.
        mean, std: mean and sample std (n − 1) of its values (std NaN for one seed).
        p: the Welch p-value against the best, uncorrected; None for the best row itself and for a
            row of one seed (or any row when no row has two seeds).
        in_group: in the best group, Holm's over the tests against the best (the best row: True;
            an untested row: False).
        flip: the flip mean m* (:func:`flip_mean`), None where untested.
        near: within one of its standard deviations of m* (or untested), where either row
            varies: it needs :data:`MORE_SEEDS` seeds.
        p_holm: the Holm-adjusted p-value over the k tests against the best (:func:`holm`); the
            row is in the group when it is ≥ alpha. None where ``p`` is.
    """

    name: str
    n: int
    mean: float
    std: float
    p: float | None
    in_group: bool
    flip: float | None
    near: bool
    p_holm: float | None = None


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
    def comparisons(self) -> int:
        """k: the tests against the best that Holm's procedure corrects over."""
        return sum(r.p is not None for r in self.rows.values())

    @property
    def uncorrected_group(self) -> list[str]:
        """The best row and the tested rows with uncorrected p ≥ alpha (each test alone), ordered as
        :attr:`group`: what the group was before Holm's correction."""
        members = (r for r in self.rows.values() if r.name == self.best or (r.p is not None and r.p >= self.alpha))
        return [r.name for r in sorted(members, key=lambda r: _rank(r.mean, self.metric))]

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


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given.

    With the k p-values sorted p₍₁₎ ≤ … ≤ p₍ₖ₎, the i-th adjusted value is
    max_{j ≤ i} min(1, (k − j + 1) p₍ⱼ₎); a hypothesis is rejected at level α when its adjusted
    value is < α, which is the step-down rule "reject p₍₁₎ < α/k, then p₍₂₎ < α/(k − 1), …,
    stopping at the first that is not". The chance of rejecting any true hypothesis is at most α
    whatever their dependence. Tied p-values get the same adjusted value.

    Raises:
        ValueError: on a value outside [0, 1].
    """
    pvalues = [float(p) for p in pvalues]
    if not all(0 <= p <= 1 for p in pvalues):
        raise ValueError(f"p-values must lie in [0, 1], got {pvalues}")
    k, adjusted, running = len(pvalues), [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(sorted(range(k), key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (k - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


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
        stats[name] = (vals, *_moments(vals))
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
            rows[name] = RowTest(name, len(vals), mean, std, p, False, flip, spread and abs(mean - flip) <= std)
    # membership is Holm's over all the tests against the best, known once every p is
    tested = [name for name, row in rows.items() if row.p is not None]
    for name, adjusted in zip(tested, holm([rows[n].p for n in tested])):
        rows[name] = replace(rows[name], p_holm=adjusted, in_group=adjusted >= alpha)
    return Selection(metric, best, rows, alpha)


@dataclass(frozen=True)
class Stability:
    """The best group under leave-one-seed-out (:func:`leave_one_seed_out`).

    Attributes:
        drops: m, the (row, seed) pairs dropped in turn: every seed of every row of at least two
            seeds (a row of one seed is never tested, so dropping it changes nothing).
        changed: (row, index of the dropped value in the row's values, the group without it) for
            each drop that gives another group (as a set of rows).
        moved: the rows that enter or leave the group in at least one such drop, in the order given.
    """

    drops: int
    changed: list[tuple[str, int, list[str]]]
    moved: list[str]

    @property
    def stable(self) -> bool:
        """No drop changes the group."""
        return not self.changed

    def describe(self) -> str:
        """``stable``, or ``fragile (n of m drops change it: rows moved A, B)``."""
        if self.stable:
            return f"stable (none of {self.drops} one-seed drops changes it)"
        return (f"fragile ({len(self.changed)} of {self.drops} one-seed drops change it; rows that enter or "
                f"leave: {', '.join(self.moved)})")


def leave_one_seed_out(values: Mapping[str, Sequence[float]], metric: str, *, alpha: float = ALPHA) -> Stability:
    """Recomputes the best group (:func:`select`, Holm's) with each seed of each row of at least two
    seeds dropped in turn, the other rows whole, and compares it with the group of all seeds.

    A drop may change the best row itself, or leave a row of two seeds with one (then untested,
    out of the group): both count as a change when the group's rows differ.

    Raises:
        ValueError, ImportError: as :func:`select`.
    """
    values = {name: [float(v) for v in vals] for name, vals in values.items()}
    full = set(select(values, metric, alpha=alpha).group)
    changed, moved = [], set()
    drops = 0
    for name, vals in values.items():
        if len(vals) < 2:
            continue
        for i in range(len(vals)):
            drops += 1
            group = select({**values, name: vals[:i] + vals[i + 1:]}, metric, alpha=alpha).group
            if set(group) != full:
                changed.append((name, i, group))
                moved |= full ^ set(group)
    return Stability(drops, changed, [n for n in values if n in moved])


@dataclass(frozen=True)
class Equivalence:
    """Two rows under TOST (:func:`equivalent`).

    Attributes:
        difference: mean(a) − mean(b), in the metric's unit.
        low, high: the 1 − 2α confidence interval of the difference (90 % at α = 0.05), Welch's.
        p: the larger of the two one-sided p-values; equivalent when p < alpha.
        margin: the equivalence margin (the difference must lie within ± margin).
        dof: the Welch–Satterthwaite degrees of freedom (NaN where neither row varies).
        alpha: each one-sided test's level.
    """

    difference: float
    low: float
    high: float
    p: float
    margin: float
    dof: float
    alpha: float = ALPHA

    @property
    def equivalent(self) -> bool:
        """Both one-sided tests reject: the interval lies inside (−margin, +margin)."""
        return self.p < self.alpha


def equivalent(a: Sequence[float], b: Sequence[float], margin: float, *, alpha: float = ALPHA) -> Equivalence:
    """Two one-sided Welch t-tests (TOST) of equivalence of ``a`` and ``b`` within ± ``margin``.

    With d = mean(a) − mean(b), se = √(s_a²/n_a + s_b²/n_b) and ν Welch–Satterthwaite's degrees
    of freedom: H₀⁻: d ≤ −margin, tested by t₁ = (d + margin)/se, p₁ = P(T_ν > t₁); H₀⁺:
    d ≥ +margin, tested by t₂ = (d − margin)/se, p₂ = P(T_ν < t₂). The rows are shown equivalent
    when both are rejected at ``alpha``, i.e. p = max(p₁, p₂) < alpha, which is the same as the
    1 − 2α interval d ± t_{1−α}(ν)·se lying inside (−margin, +margin). Where neither row varies
    (se = 0) the means decide: p = 0 if |d| < margin, else 1, and the interval is [d, d].

    Args:
        a, b: per-seed values (at least two each, finite).
        margin: > 0, in the metric's unit (:data:`MARGINS`).
        alpha: each one-sided test's level, in (0, ½).

    Raises:
        ValueError: on fewer than two values, a value that is not finite, margin ≤ 0 or alpha
            outside (0, ½).
        ImportError: without scipy.
    """
    a, b = _check(a, "the first row"), _check(b, "the second row")
    if not margin > 0:
        raise ValueError(f"the equivalence margin must be > 0, got {margin!r}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5) for two one-sided tests, got {alpha!r}")
    d = _moments(a)[0] - _moments(b)[0]
    se, dof = _welch_parts(a, b)
    if se == 0:
        return Equivalence(d, d, d, 0.0 if abs(d) < margin else 1.0, margin, dof, alpha)
    from scipy.special import stdtr, stdtrit

    p_low, p_high = stdtr(dof, -(d + margin) / se), stdtr(dof, (d - margin) / se)
    half = float(stdtrit(dof, 1 - alpha)) * se
    return Equivalence(d, d - half, d + half, float(max(p_low, p_high)), margin, dof, alpha)


def top_rows(values: Mapping[str, Sequence[float]], metric: str, k: int) -> list[str]:
    """The ``k`` rows of best mean (best first), e.g. the rows a longer-budget run repeats; rows of
    one seed count too (their mean is all there is). Ties keep the order given.

    Raises:
        ValueError: on an unknown metric, k < 1 or a row without values.
    """
    better(metric)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    means = {name: _moments(v)[0] for name, v in values.items()}
    return sorted(means, key=lambda n: _rank(means[n], metric))[:k]
