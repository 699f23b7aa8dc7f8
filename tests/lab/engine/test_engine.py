"""The training engine's shared parts: the one parameter-group rule on both models, the metrics log,
music resumes through every crash window, and training states that cannot run code."""

import pickle
import warnings

import pytest
import torch
from tiny_run import Kill, same_weights, tiny_config
from torch import nn

from spe.checkpoint import TRAIN_STATE_FILE
from spe.lab.cli.main import main
from spe.models import ModelConfig
from spe.models.classifier_config import ClassifierConfig
from spe.models.decoder_lm import DecoderLM
from spe.models.encoder_classifier import EncoderClassifier
from spe.lab.engine import core as engine, state
from spe.lab.music.train import train
from spe.lab.engine.metrics_log import read_records, trim_records
from spe.lab.engine.optim import decayed_parameter_names, learning_rate_factor, param_groups
from spe.lab.engine.state import CHECKPOINTS_DIR

SMALL = {"d_model": 16, "num_heads": 2, "num_layers": 2, "d_ff": 32}


def _matrices(num_layers: int, head: tuple[str, ...]) -> list[str]:
    """The names the rule must decay: attention projections and feed-forward weights per block, the head."""
    names = []
    for i in range(num_layers):
        names += [f"blocks.{i}.attn.qkv.weight", f"blocks.{i}.attn.out.weight", f"blocks.{i}.ffn.0.weight",
                  f"blocks.{i}.ffn.2.weight"]
    return names + list(head)


@pytest.mark.parametrize("positional,attention,options", [
    ("sinespe", "performer", {"gated": True, "share_across_layers": False}),
    ("convspe", "performer", {"gated": True}),
    ("ape-learned", "performer", {}),
    ("shaw", "softmax", {}),
    ("music-relative", "softmax", {}),
    ("rope", "linear-elu", {}),
])
@pytest.mark.parametrize("tied", [True, False])
def test_the_decoder_decays_its_weight_matrices_only(positional, attention, options, tied):
    model = DecoderLM(ModelConfig(vocab_size=30, positional=positional, attention=attention, tie_embeddings=tied,
                                  **SMALL, **options))
    assert decayed_parameter_names(model) == _matrices(2, () if tied else ("head.weight",))
    decay, rest = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))  # a tied head once
    never = [n for n, _ in model.named_parameters()
             if n.startswith(("embed", "ape", "encoding", "layer_encodings")) or "spe_filter" in n
             or "score_encoding" in n or n.endswith("bias") or "norm" in n]
    assert never and not set(never) & set(decayed_parameter_names(model))


@pytest.mark.parametrize("positional", ["sinespe", "convspe", "ape-learned", "none"])
def test_the_classifier_decays_its_weight_matrices_only_and_never_an_spe_gate(positional):
    model = EncoderClassifier(ClassifierConfig(vocab_size=30, num_classes=3, positional=positional,
                                               attention="performer", gated=True, max_positions=40, **SMALL))
    assert decayed_parameter_names(model) == _matrices(2, ("head.0.weight", "head.2.weight"))
    names = dict(model.named_parameters())
    if positional in ("sinespe", "convspe"):
        assert "blocks.1.attn.spe_filter.gate_logits" in names  # 2-D, the old LRA rule decayed it


def test_a_positional_module_is_never_decayed_even_where_it_holds_a_linear_layer():
    class Learned(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)

    Learned.__module__ = "spe.encodings.learned"  # a positional encoding by where it is defined
    model = nn.Sequential(nn.Linear(4, 4), Learned())
    assert decayed_parameter_names(model) == ["0.weight"]


def test_schedules_warm_up_then_decay():
    common = {"steps": 110, "warmup_steps": 10}
    assert learning_rate_factor(0, **common) == pytest.approx(0.1)
    assert learning_rate_factor(60, **common, min_lr_ratio=0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert learning_rate_factor(500, **common, min_lr_ratio=0.1) == pytest.approx(0.1)
    assert learning_rate_factor(39, **common, schedule="rsqrt") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="schedule must be one of cosine, rsqrt, got 'linear'"):
        learning_rate_factor(0, **common, schedule="linear")


def test_the_metrics_log_drops_a_torn_last_line_names_the_file_and_trims_atomically(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    with pytest.warns(UserWarning, match=rf"{path}: dropped its last line, half-written"):
        assert [r["step"] for r in read_records(path)] == [1, 2]
    with pytest.warns(UserWarning):
        assert [r["step"] for r in trim_records(path, 1)] == [1]
    assert path.read_text() == '{"step": 1, "loss": 2.0}\n'
    assert not list(tmp_path.glob(".*tmp"))
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=rf"{path}: line 2 is not a metrics record"):
        read_records(path)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    return train(tiny_config(tmp_path_factory.mktemp("music"), "straight"), progress=False)


@pytest.mark.slow
def test_music_killed_between_the_state_and_the_model_resumes_to_the_same_weights(tmp_path, monkeypatch,
                                                                                   straight):
    original = state.save

    def kill_at_step_4(model, folder, **kwargs):
        if "step-0000004" in str(folder):
            raise Kill
        return original(model, folder, **kwargs)

    monkeypatch.setattr(state, "save", kill_at_step_4)
    cfg = tiny_config(tmp_path, "killed")
    with pytest.raises(Kill):
        train(cfg, progress=False)
    monkeypatch.setattr(state, "save", original)
    assert (tmp_path / "killed" / CHECKPOINTS_DIR / "step-0000004" / TRAIN_STATE_FILE).is_file()  # half a unit
    train(cfg, resume=True, progress=False)
    assert same_weights(straight, tmp_path / "killed")


@pytest.mark.slow
def test_a_state_of_an_older_format_is_refused_naming_the_file(tmp_path, monkeypatch):
    original = engine._Training.save

    def kill_after_step_4(run, *args):
        original(run, *args)
        if run.step == 4:
            raise Kill

    monkeypatch.setattr(engine._Training, "save", kill_after_step_4)
    cfg = tiny_config(tmp_path, "old")
    with pytest.raises(Kill):
        train(cfg, progress=False)
    monkeypatch.setattr(engine._Training, "save", original)
    file = tmp_path / "old" / CHECKPOINTS_DIR / "step-0000004" / TRAIN_STATE_FILE
    old = torch.load(file, weights_only=True)
    old["format_version"] = 1  # format 1 pickled NumPy's random state as an array; nothing reads it now
    torch.save(old, file)
    with pytest.raises(ValueError, match=r"step-0000004/train_state\.pt .*format version 1"):
        train(cfg, resume=True, progress=False)


class _Payload:
    """Unpickling this calls open(marker, "w"): a file appears if the state's code runs."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.mark.slow
def test_spe_train_resume_refuses_a_state_that_would_run_code_in_one_line(tmp_path, capsys, straight):
    from tiny_run import toml_text

    run = tmp_path / "run"
    cfg = tiny_config(tmp_path, "run", steps=8)
    (tmp_path / "run.toml").write_text(toml_text(cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(tiny_config(tmp_path, "run"), progress=False)
    marker = tmp_path / "marker"
    good = torch.load(run / TRAIN_STATE_FILE, weights_only=True)
    pickle.loads(pickle.dumps(_Payload(tmp_path / "live"))).close()
    assert (tmp_path / "live").exists()  # the payload is live
    torch.save({**good, "payload": _Payload(marker)}, run / TRAIN_STATE_FILE)  # the unit's file: a hard link
    assert main(["-q", "train", "--config", str(tmp_path / "run.toml"), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert not marker.exists()
    assert len(err) == 1 and "refused" in err[0] and f"train_state.pt: it holds {open.__module__}.open, which is not data" in err[0]


def test_spe_train_compile_flag_reaches_the_configuration(monkeypatch, tmp_path):
    import spe.lab.music.train as loop

    seen = []
    monkeypatch.setattr(loop, "train", lambda cfg, **kwargs: seen.append(cfg) or tmp_path)
    assert main(["-q", "train", "--out", str(tmp_path / "a"), "--compile"]) == 0
    assert main(["-q", "train", "--out", str(tmp_path / "b")]) == 0
    assert [cfg.compile for cfg in seen] == [True, False]
