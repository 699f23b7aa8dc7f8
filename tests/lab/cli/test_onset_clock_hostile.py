"""The onset clock's settings: a user's onset_scale is kept and said; hand-edited headers refused in one line."""

import re
import warnings

import pytest
from tiny_run import rewrite_header, tiny_config

from spe.checkpoint import load_metadata
from spe.lab.cli.main import main
from spe.lab.music.train import train

ONSET = {"positional": "sinespe", "spe_time": "onset", "dropout": 0.0}


@pytest.fixture(scope="module")
def onset_run(tmp_path_factory):
    """A 2-step onset-clock run, and copies of its checkpoint with a damaged clock in the header."""
    root = tmp_path_factory.mktemp("onset")
    cfg = tiny_config(root, "run", model=ONSET, steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(cfg, progress=False)
    checkpoint = root / "run" / "model.safetensors"
    tokens = load_metadata(checkpoint)["config"]["onset_tokens"]
    rewrite_header(checkpoint, root / "scale_1e308", config={"onset_scale": 1e308})
    bar = next(name for name in tokens if name.startswith("Bar"))
    rewrite_header(checkpoint, root / "timesig_0", config={"onset_tokens": {**tokens, "TimeSig_0/4": tokens[bar]}})
    rewrite_header(checkpoint, root / "timesig_over_0",
                   config={"onset_tokens": {**tokens, "TimeSig_4/0": tokens[bar]}})
    return root, cfg


@pytest.mark.slow
def test_an_explicit_onset_scale_is_kept_and_said(onset_run, tmp_path):
    root, _ = onset_run
    measured = load_metadata(root / "run")["config"]["onset_scale"]
    cfg = tiny_config(root, "given", model={**ONSET, "onset_scale": 2.5}, steps=1)
    with pytest.warns(UserWarning, match=rf"onset_scale 2\.5 .*{measured:.4g}.*leave onset_scale out"):
        train(cfg, progress=False)
    assert load_metadata(root / "given")["config"]["onset_scale"] == 2.5


@pytest.mark.slow
@pytest.mark.parametrize("name,message", [
    ("scale_1e308", r"onset_scale must be a number in \[0, 1e\+06\] \(tokens per beat; 0: not set\), got 1e\+308"),
    ("timesig_0", r"the onset clock's token 'TimeSig_0/4' is no time signature"),
    ("timesig_over_0", r"the onset clock's token 'TimeSig_4/0' is no time signature"),
])
@pytest.mark.parametrize("command", ["evaluate", "generate"])
def test_a_damaged_onset_clock_in_a_header_is_one_line(onset_run, name, message, command, capsys):
    root, _ = onset_run
    out = root / f"out-{command}-{name}"
    argv = (["evaluate", "--checkpoint", str(root / name), "--out", str(out), "--eval-length", "40"]
            if command == "evaluate" else
            ["generate", "--checkpoint", str(root / name), "--length", "4", "--out", str(out / "x.mid")])
    capsys.readouterr()
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"spe {command}: error: "), err
    assert re.search(message, err[0]) and f"{name}/model.safetensors" in err[0], err[0]
    assert not out.exists()
