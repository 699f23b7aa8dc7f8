"""positional_lr_scale: positional-encoding parameters learn at a multiple of the lr; 1.0 changes nothing."""

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import TINY_LRA_MODEL, lra_dataset, lra_splits, tiny_lra_config

from spe.lab.lra import LRAConfig, build_classifier, preset_config
from spe.lab.lra.train import train_seed
from spe.lab.engine import core as engine, optim



def _model(seed=0):
    torch.manual_seed(seed)
    cfg = LRAConfig(task="listops", positional="sinespe", attention="performer", model=TINY_LRA_MODEL, batch_size=4)
    return cfg, build_classifier(cfg, lra_dataset("listops"))


def _names(model, params) -> set[str]:
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def _old_rule(model, weight_decay):
    """The parameter groups before the option existed (commit cf8c37e), verbatim in effect."""
    decayed = set(optim.decayed_parameter_names(model))
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in params if n in decayed], "weight_decay": weight_decay},
            {"params": [p for n, p in params if n not in decayed], "weight_decay": 0.0}]


def test_scale_one_keeps_the_two_groups_of_before():
    _, model = _model()
    new, old = optim.param_groups(model, 0.01), _old_rule(model, 0.01)
    assert [set(g) for g in new] == [{"params", "weight_decay"}] * 2  # no new key in saved optimizer states
    assert [[id(p) for p in g["params"]] for g in new] == [[id(p) for p in g["params"]] for g in old]
    assert [g["weight_decay"] for g in new] == [0.01, 0.0]


def test_a_scale_moves_exactly_the_positional_parameters_into_a_third_group():
    _, model = _model()
    groups = optim.param_groups(model, 0.01, positional_lr_scale=4.0)
    positional = {n for n, _ in model.named_parameters() if n.startswith("encoding") or "spe_filter" in n}
    assert positional and _names(model, groups[2]["params"]) == positional
    assert (groups[2]["weight_decay"], groups[2]["lr_scale"]) == (0.0, 4.0)
    assert _names(model, groups[0]["params"]) == set(optim.decayed_parameter_names(model))
    assert not _names(model, groups[1]["params"]) & positional
    assert sum(len(g["params"]) for g in groups) == sum(1 for p in model.parameters() if p.requires_grad)
    assert optim.scaled_lr(groups[2], 1e-3) == pytest.approx(4e-3) and optim.scaled_lr(groups[1], 1e-3) == 1e-3


def test_the_optimizer_starts_positional_parameters_at_scale_times_the_lr():
    cfg, model = _model()
    optimizer = optim.adamw(model, lr=1e-2, weight_decay=cfg.weight_decay, positional_lr_scale=4.0)
    assert [g["lr"] for g in optimizer.param_groups] == [1e-2, 1e-2, pytest.approx(4e-2)]


@pytest.mark.slow
def test_one_adamw_step_moves_positional_parameters_scale_times_as_far(tmp_path):
    """Adam's first step is lr · g / (|g| + ε) per element (no decay on these parameters): linear in the lr.

    The step is the engine's (spe lra's code path): one step, no warmup, so the scheduled lr is the peak.
    """
    splits, moves = lra_splits(), {}
    for scale in (1.0, 4.0):
        cfg = tiny_lra_config(steps=1, eval_every=1, warmup_steps=0, lr=1e-2, positional_lr_scale=scale)
        torch.manual_seed(0)  # the engine builds the model of seed s right after torch.manual_seed(s)
        before = build_classifier(cfg, splits["train"]).state_dict()
        train_seed(cfg, splits, 0, tmp_path / str(scale), progress=False)
        after = load_file(str(tmp_path / str(scale) / "last" / "model.safetensors"))
        moves[scale] = {n: after[n] - before[n] for n in after if before[n].is_floating_point()}
    positional = [n for n in moves[1.0] if n.startswith("encoding") or "spe_filter" in n]
    for name in positional:
        # float32 rounding of p + δ and of (p + δ) − p: a few ulps of the parameter's magnitude
        ulp = torch.finfo(torch.float32).eps * (1 + moves[4.0][name].abs().max() + 10)
        torch.testing.assert_close(moves[4.0][name], 4.0 * moves[1.0][name], rtol=0, atol=float(8 * ulp))
    assert any(moves[1.0][n].abs().max() > 1e-3 for n in positional)  # they did move
    for name in set(moves[1.0]) - set(positional):  # the same gradients, the same lr: the same step
        assert torch.equal(moves[4.0][name], moves[1.0][name]), name


@pytest.mark.slow
def test_scale_one_trains_bit_identically_to_the_optimizer_of_before(tmp_path, monkeypatch):
    splits = lra_splits()
    train_seed(tiny_lra_config(steps=3, eval_every=3), splits, 0, tmp_path / "now", progress=False)
    monkeypatch.setattr(engine, "adamw", lambda model, *, lr, weight_decay, positional_lr_scale:
                        torch.optim.AdamW(_old_rule(model, weight_decay), lr=lr, betas=optim.ADAM_BETAS))
    train_seed(tiny_lra_config(steps=3, eval_every=3), splits, 0, tmp_path / "before", progress=False)
    a, b = (load_file(str(tmp_path / f / "last" / "model.safetensors")) for f in ("now", "before"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_engine_applies_the_scale_at_every_step(tmp_path):
    train_seed(tiny_lra_config(steps=3, eval_every=3, warmup_steps=10, positional_lr_scale=0.25), lra_splits(), 0,
               tmp_path, progress=False)
    state = torch.load(tmp_path / "train_state.pt", weights_only=False)
    groups = state["optimizer"]["param_groups"]
    assert len(groups) == 3 and groups[2]["lr_scale"] == 0.25
    assert groups[0]["lr"] == pytest.approx(1e-3 * 3 / 10)  # the warmup's third step
    assert groups[2]["lr"] == pytest.approx(0.25 * groups[0]["lr"]) and groups[1]["lr"] == groups[0]["lr"]


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf")])
def test_bad_scales_are_refused_by_name(value):
    with pytest.raises(ValueError, match=rf"^positional_lr_scale .*> 0.*got {value!r}$"):
        preset_config("listops", "sinespe", "performer", positional_lr_scale=value)


@pytest.mark.parametrize("value", [True, "2"])
def test_a_scale_that_is_no_number_is_refused_by_the_type_checker(value):
    with pytest.raises(ValueError, match=f"positional_lr_scale must be a number, got {value!r}"):
        preset_config("listops", "sinespe", "performer", positional_lr_scale=value)
