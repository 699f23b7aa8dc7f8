"""spe bench --compile: compiled rows of the whole-model benchmark, divided by the compiled APE."""

import pytest
import torch

from spe.lab.bench.model import merge_rounds
from spe.lab.bench.tables import model_lines


def _rec(pos, times, compiled):
    return {"positional": pos, "impl": "-", "attention": "performer", "batch": 2, "length": 8, "median_ms": 0.0,
            "times_ms": times, "peak_mb": 100.0, "compiled": compiled, "parameters": 10, "model": {},
            "vocab_size": 300}


def test_compiled_rows_are_pooled_apart_and_compared_with_the_compiled_ape():
    raw = [_rec("ape", [20.0], False), _rec("sinespe", [40.0], False), _rec("ape", [10.0], True),
           _rec("sinespe", [30.0], True)]
    merged = {(r["positional"], r["compiled"]): r for r in merge_rounds(raw)}
    assert len(merged) == 4
    assert merged["sinespe", False]["time_vs_ape"] == pytest.approx(2.0)
    assert merged["sinespe", True]["time_vs_ape"] == pytest.approx(3.0)  # 30 / the compiled APE's 10
    table = "\n".join(model_lines(list(merged.values())))
    assert "| sinespe (auto) + performer (compiled) | 10 | 30 |" in table and "| sinespe (auto) + performer | 10 | 40 |" in table


@pytest.mark.slow
def test_a_compiled_model_step_trains(monkeypatch):
    from spe.lab.bench.worker import model_step

    compiled, graphs = [], []

    def eager(graph, example_inputs):  # inductor takes minutes on a CPU: the captured graph runs as traced
        graphs.append(graph)
        return graph.forward

    def compile_spy(model, **options):
        compiled.append(model)
        return real_compile(model, backend=eager)

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", compile_spy)
    case = {"length": 16, "batch": 2, "positional": "ape", "attention": "performer", "impl": "-",
            "vocab_size": 40, "model": {"d_model": 16, "num_heads": 2, "num_layers": 1, "d_ff": 32}}
    run, _ = model_step({**case, "compiled": True}, torch.device("cpu"))
    (model,) = compiled
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run()
    assert graphs, "the step did not go through the compiled forward"
    after = model.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    moved = {k for k in after if not torch.equal(after[k], before[k])}
    assert {"embed.weight", "blocks.0.attn.qkv.weight", "blocks.0.ffn.0.weight", "head.weight"} <= moved, sorted(moved)
