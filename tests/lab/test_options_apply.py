"""An option given explicitly that the chosen positional encoding or kernel does not read is
refused in one line (it would train without it and record it as if it applied); defaults and
the values of a config file or preset are not."""

import pytest

from spe.encodings.registry import encodings_reading
from spe.lab.cli.main import main
from spe.models.config import check_options_apply


@pytest.mark.parametrize("command, argv, names", [
    ("train", ["--positional", "rope", "--spe-time", "learned"], ["--spe-time learned", "'rope'", "sinespe"]),
    ("train", ["--rope-time", "learned"], ["--rope-time learned", "'sinespe'", "rope only"]),
    ("train", ["--positional", "rope", "--spe-time", "onset"], ["--spe-time onset", "'rope'"]),
    ("train", ["--positional", "ape", "--gated"], ["--gated", "'ape'", "sinespe"]),
    ("train", ["--positional", "convspe", "--num-sines", "3"], ["--num-sines 3", "'convspe'"]),
    ("train", ["--positional", "sinespe", "--kernel-size", "8"], ["--kernel-size 8", "'sinespe'", "convspe"]),
    ("train", ["--positional", "rope", "--max-distance", "8"], ["--max-distance 8", "shaw"]),
    ("train", ["--positional", "shaw", "--model-option", "num_features=32"],
     ["--model-option num_features=32", "attention 'softmax'", "performer"]),
    ("synth", ["--task", "flip-flop", "--positional", "rope", "--spe-time", "learned"],
     ["--spe-time learned", "'rope'"]),
    ("synth", ["--task", "flip-flop", "--positional", "none", "--num-realizations", "8"],
     ["--num-realizations 8", "'none'"]),
])
def test_an_option_the_encoding_or_kernel_does_not_read_is_refused(tmp_path, capsys, command, argv, names):
    out = tmp_path / "out"
    assert main([command, *argv, "--out", str(out), "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    for name in names:
        assert name in err[0]
    assert not out.exists()


def test_the_config_files_values_and_defaults_do_not_trigger_it(tmp_path, capsys):
    # the packaged demo config sets num_realizations and num_sines; rope reads neither, and that
    # is no mistake of the user's: the run goes on to its next check (the data folder)
    assert main(["train", "--positional", "rope", "--rope-time", "learned", "--data", str(tmp_path / "none"),
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "data folder" in err and "does not read" not in err


def test_the_readers_of_an_option_come_from_the_encodings_specs():
    assert encodings_reading("spe_time") == ("sinespe", "sinespe-exact")
    assert encodings_reading("rope_time") == ("rope",)
    assert encodings_reading("d_model") == ()


def test_the_library_check_names_the_kernels_that_read_a_kernel_option():
    check_options_apply({"positional": "rope", "attention": "performer"}, {"num_features": "num_features=32"})
    check_options_apply({"positional": "rope"}, {"d_model": "--d-model 64", "decay": "--decay fixed"})
    with pytest.raises(ValueError, match="chunk_size.*performer, linear-relu"):
        check_options_apply({"positional": "rope", "attention": "softmax"}, {"chunk_size": "chunk_size=16"})


def test_spe_demo_refuses_an_option_none_of_its_encodings_reads(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--positionals", "ape,rope", "--spe-time", "learned", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "positionals 'ape', 'rope' do not read spe_time" in err[0]
    assert not out.exists()
    # one of them reads it: on to the next check (the data folder)
    assert main(["demo", "--positionals", "sinespe,ape", "--num-realizations", "4", "--data", str(tmp_path / "none"),
                 "--out", str(out)]) == 2
    assert "does not read" not in capsys.readouterr().err


def test_a_synth_presets_spe_options_do_not_trigger_it(tmp_path):
    # the cpu-small preset sets num_realizations for every row; rope with no SPE flag is no mistake
    assert main(["synth", "--task", "flip-flop", "--positional", "rope", "--eval-lengths", "64",
                 "--write-data", str(tmp_path / "data")]) == 0
    assert (tmp_path / "data" / "vocab.json").is_file()
