"""tools/analysis/clock_probe.py: what it reports of a model's clock and gates is what they compute."""

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from spe.lab.synth.data import IGNORE
from spe.models import DecoderLM, ModelConfig

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("clock_probe_tool", ROOT / "tools" / "analysis" / "clock_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(**options) -> DecoderLM:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=12, d_model=16, num_heads=2, num_layers=2, d_ff=32, dropout=0.0,
                         num_realizations=8, **options)
    return DecoderLM(config).eval()


def _data(length: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, 12, (3, length), generator=torch.Generator().manual_seed(1))
    targets = torch.full_like(tokens, IGNORE)
    targets[:, 2::3] = tokens[:, 2::3]
    return tokens, targets


def test_untrained_learned_clock_is_the_index_clock_and_spe_gate_one_half(tool):
    model = _model(positional="sinespe", spe_time="learned", gated=True, decay="gated")
    records = tool.probe(model, *_data())
    assert [r["layer"] for r in records] == ["blocks.0", "blocks.1"]
    for record in records:
        for key in ("step_mean", "step_at_targets", "step_elsewhere"):
            assert record[key] == pytest.approx([1.0, 1.0], abs=1e-6)
        assert record["clock_span"] == pytest.approx([8.0, 8.0], abs=1e-6)  # T − 1 steps of 1
        assert record["spe_gate_mean"] == pytest.approx([0.5, 0.5])
        assert all(0.0 < g <= 1.0 for g in record["forget_mean"])
    assert not any(m._forward_hooks for m in model.modules())  # the probe leaves no hook behind


def test_steps_split_by_targets_and_forget_gate_is_exp_of_the_log_gate(tool):
    model = _model(positional="sinespe", spe_time="learned", decay="gated")
    tokens, targets = _data()
    clock = model.blocks[0].attn.spe_filter.clock
    x = model.blocks[0].norm1(model.embed(tokens)).detach()  # what the first block's clock reads
    with torch.no_grad():  # a clock that reads its input, so the split by targets matters
        clock.weight.normal_(generator=torch.Generator().manual_seed(2))
    delta = clock.steps(x).double()
    scored = targets != IGNORE
    record = tool.probe(model, tokens, targets)[0]
    assert record["step_at_targets"] == pytest.approx(delta[scored].mean(0).tolist())
    assert record["step_elsewhere"] == pytest.approx(delta[~scored].mean(0).tolist())
    assert record["clock_span"] == pytest.approx(delta[:, 1:].sum(1).mean(0).tolist())
    log_gate = model.blocks[0].attn.decay_gate(x)
    assert record["forget_mean"] == pytest.approx(log_gate.double().exp().mean((0, 1)).tolist())
    assert not math.isclose(record["step_at_targets"][0], record["step_elsewhere"][0], rel_tol=1e-3)


def test_channel_gate_is_averaged_over_channels_and_index_models_report_no_clock(tool):
    model = _model(positional="sinespe", decay="gated-channel", attention="linear-elu")
    tokens, targets = _data()
    record = tool.probe(model, tokens, targets)[0]
    assert "step_mean" not in record and "spe_gate_mean" not in record
    x = model.blocks[0].norm1(model.embed(tokens)).detach()
    kept = model.blocks[0].attn.decay_gate(x).double().exp()  # (N, T, H, M)
    assert record["forget_mean"] == pytest.approx(kept.mean((0, 1, 3)).tolist())


def test_the_docs_table_is_the_committed_probe_data(tool):
    data = ROOT / "docs" / "data" / "probes" / "learned-time-clocks.jsonl"
    lines = [json.loads(line) for line in data.read_text().splitlines()]
    text = (ROOT / "docs" / "learned-time.md").read_text()
    block = text.split("<!-- clock-probe:learned-time-clocks -->\n", 1)[1].split("\n<!-- /clock-probe -->", 1)[0]
    assert block == tool.summary_table(lines)
