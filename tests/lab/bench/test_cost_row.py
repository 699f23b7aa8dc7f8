"""README's cost row from a `spe bench --modes model` run (spe.lab.bench.tables.cost_row)."""

import pytest

from spe.lab.bench.tables import cost_row


def _step(positional, impl, round_, median_ms, **extra):
    return {"positional": positional, "impl": impl, "attention": "performer", "decay": "none", "batch": 8,
            "length": 2048, "round": round_, "median_ms": median_ms, "device": "cpu", "threads": 2,
            "load_1min": 0.5 + round_, **extra}


def _payload():
    rounds = [_step("ape", "-", 0, 100.0), _step("sinespe", "-", 0, 110.0, resolved_impl="materialized"),
              _step("ape", "-", 1, 200.0), _step("sinespe", "-", 1, 260.0, resolved_impl="materialized")]
    merged = [_step("ape", "-", 0, 150.0, rounds=2, time_vs_ape=1.0, memory_vs_ape=1.0),
              _step("sinespe", "-", 0, 185.0, rounds=2, time_vs_ape=185 / 150, memory_vs_ape=1.125,
                    resolved_impl="materialized")]
    return {"model": merged, "model_rounds": rounds}


def test_the_row_gives_the_merged_ratio_and_the_range_of_the_per_round_ratios():
    row = cost_row(_payload(), question="Cost", batch=8, length=2048, source="[p](p.md)")
    # per round: 110 / 100 = 1.10 and 260 / 200 = 1.30 (each round over APE's in that round, not over
    # APE's median of all rounds, 150, which would give 0.73 and 1.73)
    assert row == ("| Cost: one AdamW step at 8 × 2,048 tokens, × APE's (cpu, 2 threads, 2 rounds, load 0.5–1.5) | "
                   "`sinespe (auto → materialized) + performer` 1.23× time (rounds 1.10–1.30×), 1.12× memory "
                   "| [p](p.md) |")


def test_a_shape_the_run_does_not_hold_is_refused_naming_the_shapes_held():
    with pytest.raises(ValueError, match=r"batch 2 × N = 8,192 \(shapes held: \[\(8, 2048\)\]\)"):
        cost_row(_payload(), question="Cost", batch=2, length=8192, source="s")
