"""State passing (``spe train --state-passing``): crops start from the detached final states of
the previous step's crops, positions running on; refused without a recurrent state; resumable."""

import math

import pytest
import torch
from tiny_run import RTOL, Kill, needs_gloo, records, same_weights, tiny_config, toml_text, torchrun

from spe.checkpoint import TRAIN_STATE_FILE
from spe.lab.cli.main import main
from spe.models import ModelConfig
from spe.models.decoder_lm import DecoderLM, DecodingState
from spe.lab.engine import core as engine
from spe.lab.music.config import TrainConfig
from spe.lab.music.train import train
from spe.lab.music.state_passing import StatePassing, chain_steps
from spe.lab.music import task as lm

# Recurrent models of each state kind: FAVOR+ sums with SPE, a gate with RoPE, a window's kept
# keys with their gates, a short convolution's cache with GLA's channel gate and convSPE.
MODELS = {
    "performer-sinespe": {"attention": "performer", "positional": "sinespe"},
    "linear-elu-gated": {"attention": "linear-elu", "positional": "rope", "decay": "gated"},
    "windowed": {"attention": "performer", "positional": "sinespe", "attention_window": 5, "decay": "gated"},
    "short-conv": {"attention": "linear", "positional": "convspe", "kernel_size": 8, "short_conv": 4,
                   "decay": "gated-channel"},
}


def _model(**options) -> DecoderLM:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=20, d_model=16, num_layers=2, num_heads=2, d_ff=32, num_realizations=4,
                         num_features=8, chunk_size=4, dropout=0.0, **options)
    return DecoderLM(config).double()


def _seeded() -> torch.Generator:
    return torch.Generator().manual_seed(5)


@pytest.mark.parametrize("options", MODELS.values(), ids=MODELS)
def test_forward_with_state_equals_the_parallel_forward_over_the_crops_joined(options):
    model = _model(**options)  # training mode: codes from the generator given
    tokens = torch.randint(0, 20, (3, 14), generator=torch.Generator().manual_seed(1))
    whole = model(tokens, generator=_seeded())
    state, parts = None, []
    for crop in (tokens[:, :5], tokens[:, 5:9], tokens[:, 9:]):  # positions run on from each state
        logits, state = model.forward_with_state(crop, state, generator=_seeded())
        parts.append(logits)
    assert state.position == 14
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=1e-10, atol=1e-12)


def test_no_gradient_reaches_the_previous_step():
    model = _model(**MODELS["linear-elu-gated"])
    first, second = torch.randint(0, 20, (2, 2, 6), generator=torch.Generator().manual_seed(2))
    params = list(model.parameters())
    passing = StatePassing(chain_steps(model.config, 6))
    passing.carry(model.forward_with_state(first)[1])  # a state with its graph, carried detached
    carried = torch.autograd.grad(model.forward_with_state(second, passing.state)[0].sum(), params)
    with torch.no_grad():
        constant = model.forward_with_state(first)[1]
    expected = torch.autograd.grad(model.forward_with_state(second, constant)[0].sum(), params)
    assert all(torch.equal(a, b) for a, b in zip(carried, expected))


def test_a_chain_restarts_every_k_steps_and_at_feature_redraws_with_one_code_per_chain():
    passing = StatePassing(4, redraw_every=6)
    code = torch.Generator().manual_seed(0)
    starts, seeds = [], []
    for _ in range(10):
        batch = passing.batch(torch.zeros(2, 9, dtype=torch.long), code)
        start = 0 if batch.state is None else batch.state.position
        starts.append(start)
        seeds.append(batch.code_seed)
        passing.carry(DecodingState(position=start + 8, layers=[]))
    assert starts == [0, 8, 16, 24, 0, 8, 0, 8, 0, 8]  # chains from steps 0, 4, 6 (a redraw) and 8
    # one code per chain, a new one for each
    assert seeds == [seeds[0]] * 4 + [seeds[4]] * 2 + [seeds[6]] * 2 + [seeds[8]] * 2 and len(set(seeds)) == 4


def test_chains_stop_at_sixteen_crops_or_at_a_position_limit():
    assert chain_steps(ModelConfig(vocab_size=20), 32) == 16
    assert chain_steps(ModelConfig(vocab_size=20, positional="ape-learned", max_positions=100), 32) == 3
    with pytest.raises(ValueError, match=r"ape-learned .*50 .*2 × seq_len = 64"):
        TrainConfig(seq_len=32, state_passing=True, model={"positional": "ape-learned", "max_positions": 50})


def _losses(run) -> list[float]:
    return [r["loss"] for r in records(run)]


@pytest.mark.slow
def test_spe_train_state_passing_trains_from_the_previous_steps_states(tmp_path):
    # No code and no dropout: the first step (from no state) is the plain run's, the next are not.
    model = {"attention": "linear-elu", "positional": "none", "decay": "gated", "dropout": 0.0}
    plain = train(tiny_config(tmp_path, "plain", model=model), progress=False)
    (tmp_path / "tiny.toml").write_text(toml_text(tiny_config(tmp_path, "passed", model=model)))
    assert main(["-q", "train", "--config", str(tmp_path / "tiny.toml"), "--state-passing", "--no-progress"]) == 0
    passed, without = _losses(tmp_path / "passed"), _losses(plain)
    assert len(passed) == 6 and all(math.isfinite(x) for x in passed)
    assert passed[0] == without[0] and all(a != b for a, b in zip(passed[1:], without[1:]))
    saved = torch.load(tmp_path / "passed" / TRAIN_STATE_FILE, weights_only=True)["task"][0]
    assert saved["state"]["position"] == 6 * 32 and len(saved["state"]["layers"]) == 1


@pytest.mark.parametrize("flags, why", [(["--attention", "softmax"], ""),
                                        (["--positional", "shaw"], " (positional shaw acts on its scores)")])
def test_kernels_without_a_recurrent_state_are_refused_before_any_work(tmp_path, capsys, monkeypatch, flags, why):
    def no_model(*args):
        raise AssertionError("the model was built")

    monkeypatch.setattr(lm, "build_model", no_model)
    (tmp_path / "tiny.toml").write_text(toml_text(tiny_config(tmp_path, "refused", model={"positional": "none"})))
    argv = ["-q", "train", "--config", str(tmp_path / "tiny.toml"), *flags, "--state-passing", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith(
        f"state_passing needs a recurrent-state kernel (performer, linear-relu, linear-elu, linear); softmax keeps "
        f"a KV cache{why} (options of that file and the command line)")
    assert not (tmp_path / "refused").exists()


@pytest.mark.slow
def test_a_killed_run_resumes_its_carried_states_bit_for_bit(tmp_path, monkeypatch):
    # A window's kept keys and gates inside a short convolution's state: every carried field saved.
    def config(name):
        return tiny_config(tmp_path, name, state_passing=True, model={"short_conv": 2, "decay": "gated"})

    straight = train(config("straight"), progress=False)
    train_step = engine._Training.train_step

    def killed_before_step_5(run):  # the checkpoint of step 4 is written, the carried states move on
        if run.step == 4:
            raise Kill
        return train_step(run)

    monkeypatch.setattr(engine._Training, "train_step", killed_before_step_5)
    with pytest.raises(Kill):
        train(config("killed"), progress=False)
    monkeypatch.setattr(engine._Training, "train_step", train_step)
    train(config("killed"), resume=True, progress=False)
    assert same_weights(straight, tmp_path / "killed")
    assert _losses(straight) == _losses(tmp_path / "killed")


@pytest.mark.slow
def test_state_passing_can_start_when_a_plain_run_resumes(tmp_path):
    # The paper post-trains with it: switched on at a resume, a chain starts at the next step.
    train(tiny_config(tmp_path, "run", steps=4), progress=False)
    train(tiny_config(tmp_path, "run", state_passing=True), resume=True, progress=False)
    saved = torch.load(tmp_path / "run" / TRAIN_STATE_FILE, weights_only=True)
    assert saved["step"] == 6 and saved["task"][0]["state"]["position"] == 2 * 32


@pytest.mark.slow
@needs_gloo
def test_two_processes_carry_their_own_slices_states_and_match_one(tmp_path):
    def config(name):
        return tiny_config(tmp_path, name, state_passing=True, model={"dropout": 0.0})

    one = train(config("one"), progress=False)
    torchrun(config("two"), tmp_path / "two.toml")
    for r1, r2 in zip(records(one), records(tmp_path / "two"), strict=True):
        assert r2["loss"] == pytest.approx(r1["loss"], rel=RTOL)
    whole = torch.load(one / TRAIN_STATE_FILE, weights_only=True)["task"][0]["state"]["layers"][0]
    halves = [t["state"]["layers"][0] for t in torch.load(tmp_path / "two" / TRAIN_STATE_FILE,
                                                            weights_only=True)["task"]]
    assert [h["keys"].shape[0] for h in halves] == [2, 2]  # B / N crops each
    torch.testing.assert_close(torch.cat([h["keys"] for h in halves]), whole["keys"], rtol=1e-4, atol=1e-6)
