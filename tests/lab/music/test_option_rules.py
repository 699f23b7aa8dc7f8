"""One rule per numeric option, shared by spe train (TrainConfig) and spe lra (LRAConfig), checked
before any data is read or any model is built."""

import math

import pytest

from spe.lab.cli.main import main
from spe.lab.lra.config import LRAConfig
from spe.lab.options import MAX_THREADS, parse_seeds
from spe.lab.music.config import TrainConfig

NAN, INF = math.nan, math.inf
POSITIVE = "a positive integer"
SHARED = [  # options both configurations have: (option, value, what the message says is allowed)
    ("grad_clip", -1, r"a finite number ≥ 0 \(0: no clipping\)"),
    ("grad_clip", NAN, r"a finite number ≥ 0 \(0: no clipping\)"),
    ("grad_clip", INF, r"a finite number ≥ 0 \(0: no clipping\)"),
    ("lr", INF, "a finite number > 0"),
    ("lr", NAN, "a finite number > 0"),
    ("lr", 0.0, "a finite number > 0"),
    ("weight_decay", NAN, "a finite number ≥ 0"),
    ("weight_decay", -0.1, "a finite number ≥ 0"),
    ("warmup_steps", -5, "an integer ≥ 0"),
    ("steps", 0, POSITIVE),
    ("batch_size", -2, POSITIVE),
    ("eval_every", 0, POSITIVE),
    ("keep_checkpoints", 0, POSITIVE),
    ("feature_redraw_every", -1, r"an integer ≥ 0 \(0: never\)"),
    ("seq_len", 0, POSITIVE),  # the training length: one name and one rule in every task
]
TRAIN_ONLY = [
    ("max_transpose", -3, r"an integer ≥ 0 \(semitones; 0: no transposition\)"),
    ("min_lr_ratio", NAN, r"a number in \[0, 1\]"),
    ("min_lr_ratio", 1.5, r"a number in \[0, 1\]"),
    ("seed", -1, r"an integer in \[0, 2\*\*63 - 1\]"),
    ("seed", 10 ** 20, r"an integer in \[0, 2\*\*63 - 1\]"),
    ("split_seed", -1, r"an integer in \[0, 2\*\*63 - 1\]"),
    ("val_fraction", 0.0, r"a number in \(0, 1\)"),
    ("val_fraction", 1, r"a number in \(0, 1\)"),
    ("max_piece_tokens", 0, POSITIVE),
    ("test_min_tokens", -1, r"an integer ≥ 0 \(tokens; 0: no test split\)"),
    ("num_test_pieces", 0, POSITIVE),
    *[("threads", n, rf"0 \(PyTorch's default\) or a positive number of CPU threads up to {MAX_THREADS} "
                     r"\(the CPUs this process may use\)") for n in (-1, MAX_THREADS + 1)],
]
LRA_ONLY = [
    ("eval_examples", -1, r"an integer ≥ 0 \(0: the whole split\)"),
    ("eval_batch_size", 0, POSITIVE),
    ("num_realizations", 0, "a positive integer or unset"),
]


def _train(**options):
    return TrainConfig(**options, model={"positional": "ape", "d_model": 16, "num_layers": 1, "num_heads": 2})


def _lra(**options):
    return LRAConfig(task="listops", positional="ape", attention="performer", **options)


@pytest.mark.parametrize(("make", "option", "value", "allowed"),
                         [(make, *case) for case in SHARED for make in (_train, _lra)]
                         + [(_train, *case) for case in TRAIN_ONLY] + [(_lra, *case) for case in LRA_ONLY],
                         ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_a_value_outside_its_range_is_refused_naming_the_option_the_value_and_the_range(make, option, value,
                                                                                         allowed):
    with pytest.raises(ValueError, match=rf"^{option} must be {allowed}, got {value!r}$"):
        make(**{option: value})


@pytest.mark.parametrize("make", [_train, _lra])
@pytest.mark.parametrize(("option", "value"), [("steps", True), ("warmup_steps", True), ("warmup_steps", 2.5),
                                               ("lr", True), ("grad_clip", False), ("lr", "1e-3")])
def test_a_bool_is_no_number_and_a_float_no_integer(make, option, value):
    # both configs check types first, in the same words ("training option steps must be an integer")
    with pytest.raises(ValueError, match=rf"option {option} must be .*got {value!r}"):
        make(**{option: value})


def test_the_bounds_themselves_are_accepted_where_the_rule_says_so():
    cfg = _train(grad_clip=0, weight_decay=0, warmup_steps=0, min_lr_ratio=1, max_transpose=0, seed=0, threads=0)
    assert (cfg.grad_clip, cfg.min_lr_ratio) == (0, 1)
    assert _lra(grad_clip=0.0, eval_examples=0, seq_len=None, num_realizations=None).grad_clip == 0.0
    assert parse_seeds("0,3") == [0, 3]
    with pytest.raises(ValueError, match=r"^--seeds '0,-1'.*\[0, 2\*\*63 - 1\].*got -1$"):
        parse_seeds("0,-1")


@pytest.fixture
def no_work(monkeypatch):
    """Reading the data or building the model fails the test: options are checked before either."""
    import spe.lab.music.split
    import spe.lab.music.task

    def never(*args, **kwargs):
        raise AssertionError("reached past the option checks")

    monkeypatch.setattr(spe.lab.music.split, "load_split", never)
    monkeypatch.setattr(spe.lab.music.task, "DecoderLM", never)


@pytest.mark.parametrize(("line", "facts"), [
    ("grad_clip = -1", ("grad_clip", "≥ 0", "got -1")),
    ("lr = inf", ("lr", "> 0", "got inf")),
    ("min_lr_ratio = nan", ("min_lr_ratio", "[0, 1]", "got nan")),
])
def test_spe_train_refuses_a_config_value_before_reading_data_or_building_the_model(line, facts, tmp_path,
                                                                                       no_work, capsys):
    config = tmp_path / "run.toml"
    config.write_text(f'steps = 2\n{line}\n[model]\npositional = "ape"\n')
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spe train: error: config file {config}: {facts[0]} ") and len(err.splitlines()) == 1
    assert all(fact in err for fact in facts), err
    assert not out.exists()


def test_spe_train_refuses_a_flag_value_in_the_same_words(tmp_path, no_work, capsys):
    out = tmp_path / "run"
    assert main(["train", "--lr", "nan", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spe train: error: --lr ") and err.endswith("> 0, got nan\n") and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("option,value", [("grad_clip", -1.0), ("lr", float("inf")), ("warmup_steps", -5),
                                          ("min_lr_ratio", 2.0), ("seed", -1)])
def test_the_engine_settings_keep_the_same_rules_for_python_callers(option, value):
    from spe.lab.engine.task import EngineSettings

    base = {"steps": 2, "batch_size": 2, "lr": 1e-3, "warmup_steps": 0, "eval_every": 1, "seed": 0}
    with pytest.raises(ValueError, match=rf"{option} must be"):
        EngineSettings(**{**base, option: value})
