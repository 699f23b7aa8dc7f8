"""The engine's target table reads the right records, in the right direction, with the stated limits."""

from spe.lab.bench.run import bench_markdown
from spe.lab.bench.targets import TARGETS, target_rows


def _rec(mode, pos, impl, att, n, ms, mb):
    return {"mode": mode, "positional": pos, "impl": impl, "attention": att, "length": n, "median_ms": ms,
            "peak_mb": mb, "batch": 2}


def _payload(**changes):
    records = [
        _rec("train", "sinespe", "reference", "performer", 4096, 900.0, 4000.0),
        _rec("train", "sinespe", "fused", "performer", 4096, 300.0, 350.0),     # 11.4× less: met
        _rec("train", "sinespe", "blocked", "performer", 4096, 300.0, 500.0),   # 8×: missed
        _rec("train", "ape", "-", "performer", 4096, 100.0, 300.0),
        _rec("train", "convspe", "fft", "performer", 4096, 450.0, 600.0),       # 4.5×: missed
        _rec("train", "ape", "-", "linear", 8192, 100.0, 300.0),
        _rec("train", "ape", "-", "softmax", 8192, 350.0, 300.0),               # 3.5×: met
        _rec("train", "sinespe", "-", "performer", 1024, 100.0, 100.0),
        _rec("train", "sinespe", "-", "performer", 16384, 100.0 * 16**1.05, 100.0),  # exponent 1.05: met
        _rec("generate", "sinespe", "-", "performer", 512, 5.0, 9.0),
        _rec("generate", "sinespe", "-", "performer", 16384, 5.5, 9.0),         # 1.1×: met
    ]
    model = [{"positional": "sinespe", "impl": "-", "attention": "performer", "batch": 8, "length": 2048,
              "time_vs_ape": 1.02, "memory_vs_ape": 1.07, "resolved_impl": "materialized"},
             {"positional": "sinespe", "impl": "-", "attention": "performer", "batch": 2, "length": 8192,
              "time_vs_ape": 3.0, "memory_vs_ape": 1.03, "resolved_impl": "fused"},
             {"positional": "convspe", "impl": "fft", "attention": "performer", "batch": 8, "length": 2048,
              "time_vs_ape": 1.18, "memory_vs_ape": 1.11}]
    longest = [{"positional": "ape", "impl": "-", "attention": "performer", "longest": 130000, "extrapolated": True},
               {"positional": "sinespe", "impl": "-", "attention": "performer", "longest": 120000, "extrapolated": True},
               {"positional": "convspe", "impl": "fft", "attention": "performer", "longest": 41000, "extrapolated": True},
               {"positional": "ape", "impl": "-", "attention": "softmax", "longest": 170000, "extrapolated": True}]
    payload = {"records": records, "model": model, "longest": longest, "matmul_gflops": 100.0, "config": {},
               "lengths": [512, 1024, 4096, 8192, 16384]}
    payload.update(changes)
    return payload


def _verdicts(payload):
    return {target: (measured, verdict) for target, measured, verdict in target_rows(payload)}


def test_each_target_compares_the_right_records_against_its_limit():
    rows = _verdicts(_payload())
    assert rows[next(t for t in rows if "8 × 2,048: sineSPE" in t)] == (
        "1.02× time, 1.07× memory (auto → materialized)", "met")
    assert rows[next(t for t in rows if "2 × 8,192: sineSPE" in t)][1] == "time missed, memory met"
    assert rows[next(t for t in rows if "8 × 2,048: convSPE" in t)][1] == "met"
    assert rows[next(t for t in rows if "2 × 8,192: convSPE" in t)][1] == "not measured"
    assert rows[next(t for t in rows if "sinespe within" in t)] == ("120,000 vs APE 130,000 (-8%; extrapolated)", "met")
    assert rows[next(t for t in rows if "convspe within" in t)][1] == "missed"
    # judged on what the SPE step adds over the same layer with APE (300 MB): 3,700 vs 50 MB
    assert rows[next(t for t in rows if "fused sineSPE" in t)] == (
        "whole layer 11.4× (4,000 vs 350 MB); SPE's own memory (over APE + Performer's 300 MB) 74.0× less", "met")
    assert rows[next(t for t in rows if "blocked sineSPE" in t)][1] == "met"  # 3,700 vs 200 MB: 18.5×
    no_ape = _verdicts(_payload(records=[r for r in _payload()["records"] if r["positional"] != "ape"]))
    assert no_ape[next(t for t in no_ape if "blocked sineSPE" in t)] == ("whole layer 8.0× (4,000 vs 500 MB)",
                                                                        "missed")
    assert rows[next(t for t in rows if "convSPE + Performer ≤" in t)] == ("4.50×", "missed")
    assert rows[next(t for t in rows if "SDPA" in t)] == ("3.50×", "met")
    assert rows[next(t for t in rows if "exponent" in t)] == ("1.05", "met")
    assert rows[next(t for t in rows if "flat: sinespe" in t)] == ("1.10× (5.0 → 5.5 ms)", "met")
    assert rows[next(t for t in rows if "flat: convspe" in t)][1] == "not measured"
    assert len(rows) == 14  # 4 whole-model, 3 longest, 7 one-layer rows


def test_crossing_a_limit_flips_the_verdict():
    p = _payload()
    p["records"][8] = _rec("train", "sinespe", "-", "performer", 16384, 100.0 * 16**1.15, 100.0)
    assert _verdicts(p)[next(t for t in _verdicts(p) if "exponent" in t)] == ("1.15", "missed")
    p["longest"][1] = {**p["longest"][1], "longest": 60000}  # -54 % and under 65,536
    assert _verdicts(p)[next(t for t in _verdicts(p) if "sinespe within" in t)][1] == "missed"
    assert TARGETS["longest_min"] == 65536


def test_the_report_starts_with_the_targets_and_renders_from_the_json_payload():
    text = bench_markdown(_payload(model=[], longest=[]))
    assert text.startswith("### Targets\n")
    assert "| one layer, N = 8,192: chunked causal linear attention ≥ 3× faster than SDPA causal softmax | 3.50× | met |" in text
