"""The study's rules (spe.lab.study_rules): one-sided Welch tests against the best row, the best
group at p < 0.05, and the rows near the rule's threshold that need 5 seeds."""

import math

import pytest
from conftest import shifted_to_p

from spe.lab.study_rules import ALPHA, MARGINS, better, equivalent, flip_mean, holm, leave_one_seed_out, select, \
    top_rows, welch_p

BEST = [1.0, 1.1, 1.2]  # mean 1.1, sample variance 0.01
ROW = [1.2, 1.4, 1.6, 1.8]  # mean 1.5, sample variance 0.2 / 3


def _t_sf_by_hand(t: float, dof: float, steps: int = 20000) -> float:
    """P(T > t) for Student's t with ``dof`` degrees of freedom, t > 0: ½ I_z(ν/2, ½) with
    z = ν / (ν + t²), the regularised incomplete beta integral by Simpson's rule (ν > 2 keeps the
    integrand u^(ν/2 − 1) (1 − u)^(−½) smooth on [0, z])."""
    a, b, z = dof / 2, 0.5, dof / (dof + t * t)
    f = lambda u: u ** (a - 1) * (1 - u) ** (b - 1)  # noqa: E731
    h = z / steps
    total = f(0.0) + f(z) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, steps))
    beta = math.gamma(a) * math.gamma(b) / math.gamma(a + b)
    return 0.5 * total * h / 3 / beta


def _welch_by_hand(row, best):
    n1, n2 = len(row), len(best)
    m1, m2 = sum(row) / n1, sum(best) / n2
    v1 = sum((x - m1) ** 2 for x in row) / (n1 - 1) / n1
    v2 = sum((x - m2) ** 2 for x in best) / (n2 - 1) / n2
    t = (m1 - m2) / math.sqrt(v1 + v2)
    dof = (v1 + v2) ** 2 / (v1 ** 2 / (n1 - 1) + v2 ** 2 / (n2 - 1))
    return t, dof


def test_the_p_value_is_a_one_sided_welch_test_computed_by_hand():
    # se² = (0.2/3)/4 + 0.01/3 = 0.02, t = 0.4 / √0.02 = 2√2; ν = 0.02² / ((1/60)²/3 + (1/300)²/2) = 4.0755
    t, dof = _welch_by_hand(ROW, BEST)
    assert t == pytest.approx(2 * math.sqrt(2), rel=1e-12) and dof == pytest.approx(4.07547, rel=1e-5)
    by_hand = _t_sf_by_hand(t, dof)
    p = welch_p(ROW, BEST, "cross_entropy")
    assert p == pytest.approx(by_hand, rel=1e-7)
    assert 0.02 < p < 0.03
    # A two-sided test would give 2p, Student's pooled-variance test (ν = 5, se² = 0.044 · 7/12)
    # another t and ν, far outside the tolerance above: either change turns this test red.
    pooled_t = 0.4 / math.sqrt((3 * 0.2 / 3 + 2 * 0.01) / 5 * (1 / 4 + 1 / 3))
    assert abs(_t_sf_by_hand(pooled_t, 5) - p) > 2e-3


def test_the_test_looks_only_at_the_worse_side_and_follows_the_metric():
    # A row better than the best (it is not: the best is chosen by mean, but welch_p takes any pair):
    # the one-sided p is 1 − p of the mirrored gap, not small.
    p = welch_p(ROW, BEST, "cross_entropy")
    assert welch_p(BEST, ROW, "cross_entropy") == pytest.approx(1 - welch_p(ROW, BEST, "cross_entropy"), rel=1e-12)
    # accuracy is higher-is-better: the mirrored values give the same p
    assert welch_p([-x for x in ROW], [-x for x in BEST], "accuracy") == pytest.approx(p, rel=1e-12)
    assert better("accuracy") == "higher" and better("cross_entropy") == "lower"
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        welch_p(ROW, BEST, "bleu")
    with pytest.raises(ValueError, match="at least two values"):
        welch_p([1.0], BEST, "cross_entropy")


def test_no_spread_on_either_side_is_decided_by_the_means():
    assert welch_p([2.0, 2.0], [1.0, 1.0], "cross_entropy") == 0.0
    assert welch_p([1.0, 1.0], [2.0, 2.0], "cross_entropy") == 1.0
    assert welch_p([1.0, 1.0], [1.0, 1.0], "accuracy") == 0.5


def test_the_flip_mean_is_where_p_equals_alpha():
    # Shifting the row by a constant keeps its spread, so se and ν: at m* the p-value is exactly α.
    m_star = flip_mean(ROW, BEST, "cross_entropy")
    shifted = [x - 1.5 + m_star for x in ROW]
    assert welch_p(shifted, BEST, "cross_entropy") == pytest.approx(ALPHA, rel=1e-9)
    assert welch_p([x + 1e-3 for x in shifted], BEST, "cross_entropy") < ALPHA  # worse side: out
    # for accuracy the worse side is below the best
    acc_star = flip_mean([-x for x in ROW], [-x for x in BEST], "accuracy")
    assert acc_star == pytest.approx(-m_star, rel=1e-12)


def test_the_best_group_and_the_rows_that_need_more_seeds():
    values = {
        "a": [1.0, 1.1, 1.2],  # the best (mean 1.1)
        "b": [1.1, 1.2, 1.3],  # 0.1 worse, same spread: t = 1.22, p ≈ 0.14, in the group
        "c": [2.0, 2.1, 2.2],  # far worse: out, and far from the threshold
        "d": [1.05],  # one seed: shown, untested, needs seeds
    }
    sel = select(values, "cross_entropy")
    assert sel.best == "a" and sel.group == ["a", "b"]
    b = sel.rows["b"]
    assert b.p == pytest.approx(_t_sf_by_hand(*_welch_by_hand(values["b"], values["a"])), rel=1e-7)
    assert sel.rows["c"].p < 1e-3 and not sel.rows["c"].in_group
    # b's flip mean: 1.1 + t₀.₉₅(4) · √(0.02/3) = 1.1 + 2.1318 · 0.08165 = 1.274; |1.2 − 1.274| ≤ 0.1 → near
    assert b.flip == pytest.approx(1.1 + 2.131847 * math.sqrt(0.02 / 3), rel=1e-6)
    assert b.near and not sel.rows["c"].near
    assert sel.rows["d"].p is None and not sel.rows["d"].in_group and sel.rows["d"].near
    assert sel.needs_seeds == ["a", "b", "d"]  # the best too: every test involves it
    # a row whose mean is more than one of its stds from m* is settled
    far = select({"a": values["a"], "b": [1.0 + 0.5, 1.1 + 0.5, 1.2 + 0.5]}, "cross_entropy")
    assert far.group == ["a"] and far.needs_seeds == []


def test_rows_that_never_vary_are_settled_by_their_means():
    # accuracy at the ceiling on every seed, the best too: se = 0, the test is decided by the
    # means alone (p = 0.5 for a tie), and there is no spread to carry a seed across a threshold
    sel = select({"best": [1.0, 1.0, 1.0], "tie": [1.0, 1.0, 1.0], "below": [0.9, 0.9, 0.9]}, "accuracy")
    assert sel.group == ["best", "tie"] and sel.rows["tie"].p == 0.5 and sel.rows["below"].p == 0.0
    assert sel.needs_seeds == []
    # a row without spread against a best that varies is tested as usual: near when its mean sits on m*
    best = [0.90, 0.95, 1.0]
    on_flip = flip_mean([0.8, 0.8], best, "accuracy")
    assert select({"best": best, "row": [on_flip, on_flip]}, "accuracy").rows["row"].near


def test_accuracy_picks_the_highest_and_one_seed_rows_are_never_best():
    sel = select({"x": [0.99], "y": [0.90, 0.92], "z": [0.95, 0.97]}, "accuracy")
    assert sel.best == "z" and sel.rows["y"].in_group is False
    assert sel.group == ["z"]
    assert select({"x": [0.5]}, "accuracy").best is None
    assert top_rows({"x": [0.99], "y": [0.90, 0.92], "z": [0.95, 0.97]}, "accuracy", 2) == ["x", "z"]
    assert top_rows({"x": [3.0], "y": [1.0, 2.0], "z": [0.5, 0.5]}, "cross_entropy", 2) == ["z", "y"]
    with pytest.raises(ValueError, match="row 'x' needs at least one finite value"):
        select({"x": [math.nan, 1.0]}, "accuracy")


def test_the_p_value_equals_scipys_one_sided_welch_test():
    # welch_p computes t and Student's distribution function itself (for speed); it must stay the
    # documented scipy.stats.ttest_ind(row, best, equal_var=False, alternative=...)
    from scipy.stats import ttest_ind

    for row, best in ((ROW, BEST), (BEST, ROW), ([0.5, 0.9, 0.7], [0.6, 0.61, 0.58, 0.66, 0.6])):
        greater = ttest_ind(row, best, equal_var=False, alternative="greater").pvalue
        less = ttest_ind(row, best, equal_var=False, alternative="less").pvalue
        assert welch_p(row, best, "cross_entropy") == pytest.approx(greater, rel=1e-10)
        assert welch_p(row, best, "accuracy") == pytest.approx(less, rel=1e-10)


def test_holm_rejects_step_down_as_in_the_textbook():
    # p = 0.01, 0.04, 0.03 at α = 0.05: sorted 0.01 < 0.05/3 rejected, then 0.03 ≥ 0.05/2 stops:
    # only the first is rejected (each alone at 0.05 would reject all three)
    adjusted = holm([0.01, 0.04, 0.03])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06], rel=1e-12)
    assert [p < 0.05 for p in adjusted] == [True, False, False]
    # four tests: 0.005·4 = 0.02 and 0.01·3 = 0.03 rejected, 0.03·2 = 0.06 stops, 0.04 kept by monotonicity
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], rel=1e-12)
    assert holm([0.5, 0.5, 0.5]) == [1.0, 1.0, 1.0] and holm([]) == []
    with pytest.raises(ValueError, match="1.5"):
        holm([0.1, 1.5])


def test_the_best_group_is_holms_over_the_tests_against_the_best():
    best = [1.0, 1.1, 1.2]
    values = {"best": best, "near": shifted_to_p([1.1, 1.2, 1.3], best, 0.03),
              "nearer": shifted_to_p([1.0, 1.3, 1.6], best, 0.04), "far": [3.0, 3.1, 3.2]}
    sel = select(values, "cross_entropy")
    assert sel.rows["near"].p == pytest.approx(0.03, rel=1e-6) and sel.rows["nearer"].p == pytest.approx(0.04, rel=1e-6)
    # k = 3: far (p ≈ 0) is rejected; then 0.03 · 2 = 0.06 ≥ 0.05 stops, so near and nearer stay in
    assert sel.comparisons == 3
    assert sel.rows["near"].p_holm == pytest.approx(0.06, rel=1e-6)
    assert sel.rows["nearer"].p_holm == pytest.approx(0.06, rel=1e-6)
    assert set(sel.group) == {"best", "near", "nearer"} and not sel.rows["far"].in_group
    # each test alone at 0.05 would have put both out
    assert sel.uncorrected_group == ["best"]
    # the repeat rule stays on each test alone: near (p = 0.03) sits within its std of its own flip mean
    assert sel.rows["near"].near and "near" in sel.needs_seeds


def test_leave_one_seed_out_flags_a_group_one_seed_holds_together():
    # b is in the group only through its third seed's spread: without 1.9 its two seeds sit
    # 0.2 above the best with almost no spread (p = 0.035), and it leaves
    values = {"a": [1.0, 1.1, 1.2], "b": [1.30, 1.31, 1.9]}
    assert select(values, "cross_entropy").group == ["a", "b"]
    assert welch_p([1.30, 1.31], values["a"], "cross_entropy") < ALPHA
    stability = leave_one_seed_out(values, "cross_entropy")
    assert stability.drops == 6 and not stability.stable
    assert stability.changed == [("b", 2, ["a"])] and stability.moved == ["b"]
    assert stability.describe() == "fragile (1 of 6 one-seed drops change it; rows that enter or leave: b)"
    # a row far behind, and a row of one seed (never tested, never dropped): no drop changes the group
    steady = leave_one_seed_out({"a": [1.0, 1.1, 1.2], "c": [2.0, 2.1, 2.2], "d": [0.5]}, "cross_entropy")
    assert steady.stable and steady.drops == 6 and steady.describe().startswith("stable")


def test_tost_equals_the_hand_computation_with_students_t():
    from scipy.stats import t

    a, b, margin = [1.00, 1.02, 0.99, 1.01], [0.995, 1.01, 1.005], 0.02
    ta, dof = _welch_by_hand(a, b)
    d = sum(a) / len(a) - sum(b) / len(b)
    se = d / ta
    p_low = t.sf((d + margin) / se, dof)  # H0: d ≤ −margin
    p_high = t.cdf((d - margin) / se, dof)  # H0: d ≥ +margin
    e = equivalent(a, b, margin)
    assert e.difference == pytest.approx(d, rel=1e-12) and e.dof == pytest.approx(dof, rel=1e-12)
    assert e.p == pytest.approx(max(p_low, p_high), rel=1e-9)
    half = t.ppf(0.95, dof) * se
    assert (e.low, e.high) == (pytest.approx(d - half, rel=1e-9), pytest.approx(d + half, rel=1e-9))
    # both one-sided tests reject exactly when the 90 % interval lies inside ± margin
    assert e.equivalent and -margin < e.low and e.high < margin
    wide = equivalent([1.0, 1.1, 0.9], [1.0, 1.05, 0.95], margin)
    assert not wide.equivalent and (wide.low < -margin or wide.high > margin)
    # a smaller margin than the interval's reach: not shown equivalent, p over alpha
    assert not equivalent(a, b, max(abs(e.low), abs(e.high)) * 0.9).equivalent


def test_tost_without_spread_is_decided_by_the_means_and_bad_input_is_named():
    assert equivalent([1.0, 1.0], [1.01, 1.01], 0.02).p == 0.0
    assert equivalent([1.0, 1.0], [1.05, 1.05], 0.02).p == 1.0
    assert MARGINS == {"cross_entropy": 0.02, "accuracy": 0.02}
    with pytest.raises(ValueError, match="margin must be > 0, got 0"):
        equivalent([1.0, 1.1], [1.0, 1.1], 0)
    with pytest.raises(ValueError, match="at least two values"):
        equivalent([1.0], [1.0, 1.1], 0.02)
    with pytest.raises(ValueError, match="alpha must lie in"):
        equivalent([1.0, 1.1], [1.0, 1.1], 0.02, alpha=0.5)
