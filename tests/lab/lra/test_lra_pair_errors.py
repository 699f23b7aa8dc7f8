"""``spe lra`` names the user's own mistake: an encoding the kernel cannot take is the pair's
fault (not the preset's dropout), an option the encoding or kernel does not read is refused."""

import pytest

from spe.lab.cli.main import main
from spe.lab.lra.config import preset_config


@pytest.mark.parametrize("positional, attention, allowed", [
    ("path", "performer", "use attention 'softmax'"),
    ("shaw", "performer", "use attention 'softmax'"),
    ("rope", "linear-relu", "performer or linear-elu or linear"),
    ("lrpe", "softmax", "use attention 'performer'"),
    ("alibi", "linear", "use attention 'softmax'"),
])
def test_an_impossible_pair_is_named_not_the_presets_dropout(positional, attention, allowed):
    with pytest.raises(ValueError, match=f"positional '{positional}' with attention '{attention}'") as info:
        preset_config("listops", positional, attention)
    assert allowed in str(info.value)
    assert "dropout" not in str(info.value)


def test_the_cli_names_the_pair_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["lra", "--task", "listops", "--positional", "path", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "positional 'path' with attention 'performer'" in err[0]
    assert "dropout" not in err[0]
    assert not out.exists()


@pytest.mark.parametrize("argv, names", [
    (["--positional", "rope", "--num-realizations", "8"], ["--num-realizations 8", "'rope'", "sinespe"]),
    (["--positional", "ape", "--model-option", "num_sines=3"], ["num_sines=3", "'ape'"]),
    (["--attention", "softmax", "--model-option", "num_features=8"], ["num_features=8", "'softmax'", "performer"]),
])
def test_an_option_the_run_does_not_read_is_refused(tmp_path, capsys, argv, names):
    out = tmp_path / "out"
    assert main(["lra", "--task", "listops", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    for name in names:
        assert name in err[0]
    assert not out.exists()
