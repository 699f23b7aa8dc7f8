"""spe evaluate estimates the memory of evaluating a checkpoint at the asked length and refuses,
in one line, what cannot fit (naming the estimate, the memory available and the largest length
that fits); an allocator failure during evaluation is one line too; a model of spe synth is
named as such."""

import pytest
import torch
from tiny_run import tiny_config

import spe.lab.music.evaluation.checkpoints as checkpoints
import spe.lab.music.evaluation.memory as memory
from spe.checkpoint import load_metadata, save
from spe.lab.cli.main import main
from spe.lab.music.train import train
from spe.models import DecoderLM, ModelConfig


@pytest.fixture(scope="module")
def path_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("memory")
    cfg = tiny_config(tmp, "path", steps=2, eval_every=2,
                      model={"positional": "path", "attention": "softmax", "dropout": 0.0})
    train(cfg, progress=False)
    return tmp


def _config(**options) -> ModelConfig:
    return ModelConfig(vocab_size=300, d_model=32, num_heads=2, num_layers=1, d_ff=64, **options)


def test_the_estimate_is_quadratic_for_score_terms_and_linear_for_a_linear_kernel():
    shaw, performer = _config(positional="shaw", attention="softmax"), _config(positional="rope")
    assert memory.evaluation_bytes(shaw, 8192, 1) > 3.5 * memory.evaluation_bytes(shaw, 4096, 1)
    alibi = _config(positional="alibi", attention="softmax")  # no (L, L, D) term shared by the batch
    assert memory.evaluation_bytes(alibi, 4096, 2) > 1.9 * memory.evaluation_bytes(alibi, 4096, 1)
    assert memory.evaluation_bytes(performer, 8192, 1) < 2.1 * memory.evaluation_bytes(performer, 4096, 1)


def test_path_is_quadratic_below_its_flash_threshold_and_linear_from_it():
    from spe.ops.path.flash import FLASH_MIN_LENGTH

    path = _config(positional="path", attention="softmax")
    below = memory.evaluation_bytes(path, FLASH_MIN_LENGTH - 1, 1)
    assert below > 2.5 * memory.evaluation_bytes(path, (FLASH_MIN_LENGTH - 1) // 2, 1)  # linear: 2
    assert memory.evaluation_bytes(path, 16384, 1) < 2.2 * memory.evaluation_bytes(path, 8192, 1)
    # the quadratic form peaked at 5.6 GB for a tiny PaTH model at 16,384 positions; the flash form
    # measured 85 MB at 8,192 (B 1, H 2, D 16), of which 75 MB softmax alone takes
    assert memory.evaluation_bytes(path, 16384, 1) < 3e8


def test_the_test_time_realisations_count():
    config = _config(positional="sinespe", num_realizations=8)
    usual = memory.evaluation_bytes(config, 4096, 8)
    assert memory.evaluation_bytes(config, 4096, 8, num_realizations=128) > 1.5 * usual


def test_the_largest_length_that_fits_is_the_last_within_the_budget():
    from spe.ops.path.flash import FLASH_MIN_LENGTH

    shaw = _config(positional="shaw", attention="softmax")
    budget = memory.evaluation_bytes(shaw, 1000, 1)
    assert memory.largest_length(shaw, 1, budget, 5000) == 1000
    assert memory.largest_length(shaw, 1, 10, 5000) == 0
    # PaTH's estimate drops where its flash form starts: the stretch beyond it is searched too
    path = _config(positional="path", attention="softmax")
    budget = memory.evaluation_bytes(path, 3000, 1)
    assert budget < memory.evaluation_bytes(path, FLASH_MIN_LENGTH - 1, 1)
    assert memory.largest_length(path, 1, budget, 5000) == 3000
    small = memory.evaluation_bytes(path, 500, 1)
    assert small < memory.evaluation_bytes(path, FLASH_MIN_LENGTH, 1)
    assert memory.largest_length(path, 1, small, 5000) == 500


def test_what_cannot_fit_is_refused_in_one_line_before_any_forward_pass(path_run, monkeypatch, capsys):
    def never(*args, **kwargs):
        raise AssertionError("a forward pass ran")

    monkeypatch.setattr(memory, "available_memory", lambda device: 2_000_000)
    monkeypatch.setattr(checkpoints, "per_position_cross_entropy", never)
    out = path_run / "refused"
    assert main(["evaluate", "--checkpoint", str(path_run / "path"), "--eval-length", "200",
                 "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "--eval-length 200 needs about" in err[0] and "available is 2 MB" in err[0]
    assert "positional path" in err[0] and "quadratic" in err[0]
    fits = int(err[0].split(": --eval-length ")[1].split()[0])
    model = ModelConfig.from_dict(load_metadata(path_run / "path")["config"])
    assert 0 < fits < 200
    assert memory.evaluation_bytes(model, fits, 1) <= 2_000_000 < memory.evaluation_bytes(model, fits + 1, 1)
    assert not out.exists()


def test_enough_memory_evaluates(path_run, monkeypatch, capsys):
    monkeypatch.setattr(memory, "available_memory", lambda device: 10 ** 12)
    out = path_run / "evaluated"
    assert main(["evaluate", "--checkpoint", str(path_run / "path"), "--eval-length", "64",
                 "--out", str(out), "--no-progress"]) == 0
    assert (out / "summary.json").is_file()


def test_an_allocator_failure_during_evaluation_is_one_line(path_run, monkeypatch, capsys):
    def allocator(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
                           "you tried to allocate 2147483648 bytes.")

    monkeypatch.setattr(memory, "available_memory", lambda device: 10 ** 12)
    monkeypatch.setattr(checkpoints, "per_position_cross_entropy", allocator)
    assert main(["evaluate", "--checkpoint", str(path_run / "path"), "--eval-length", "64",
                 "--out", str(path_run / "oom"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "ran out of memory at length 64" in err[0] and "--batch-size" in err[0]


def test_available_memory_reads_meminfo_without_psutil(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_psutil(name, *args, **kwargs):
        if name == "psutil":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psutil)
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 123_000_000)
    monkeypatch.setattr(memory, "_address_space_room", lambda: None)
    monkeypatch.setattr(memory, "_cgroup_room", lambda: 45_000_000)
    assert memory.available_memory("cpu") == 45_000_000
    monkeypatch.setattr(memory, "_cgroup_room", lambda: None)
    assert memory.available_memory("cpu") == 123_000_000
    monkeypatch.setattr(memory, "_address_space_room", lambda: 7_000_000)  # ulimit -v
    assert memory.available_memory("cpu") == 7_000_000


def test_a_model_of_spe_synth_is_named_with_what_to_use_instead(tmp_path, capsys):
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(vocab_size=5, d_model=16, num_heads=2, num_layers=1, d_ff=32))
    save(model, tmp_path / "ff" / "seed0", metadata={"step": 2, "synth": {"task": "flip-flop"}})
    out = tmp_path / "out"
    assert main(["evaluate", "--checkpoint", str(tmp_path / "ff" / "seed0"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "written by spe synth (flip-flop)" in err[0] and f"--out {tmp_path / 'ff'}" in err[0]
    assert "token ids" not in err[0]
    assert not out.exists()


def test_the_default_length_is_named_as_such_and_the_flag_to_lower_it(path_run, monkeypatch, capsys):
    monkeypatch.setattr(memory, "available_memory", lambda device: 300_000)
    assert main(["evaluate", "--checkpoint", str(path_run / "path"), "--split", "all",
                 "--out", str(path_run / "default"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at the default length 96 needs" in err[0] and ": --eval-length " in err[0]


def test_on_cuda_what_flex_attention_takes_forms_no_square():
    # FoX's gate and a score term with flex_arguments go to FlexAttention there; PaTH does not
    fox, path = _config(positional="none", attention="softmax", decay="gated"), _config(positional="path",
                                                                                       attention="softmax")
    for config, linear_on_cuda in ((fox, True), (path, False)):
        cpu = memory.evaluation_bytes(config, 16384, 1)
        cuda = memory.evaluation_bytes(config, 16384, 1, device="cuda")
        assert (cuda <= cpu) if linear_on_cuda else (cuda == cpu)


def test_fox_is_linear_in_the_length_from_its_flash_threshold_on():
    from spe.ops.softmax import FLASH_FOX_MIN_LENGTH

    fox = _config(positional="none", attention="softmax", decay="gated")
    short = memory.evaluation_bytes(fox, FLASH_FOX_MIN_LENGTH * 16, 1)
    long = memory.evaluation_bytes(fox, FLASH_FOX_MIN_LENGTH * 64, 1)
    assert long < 4.5 * short  # 4x the length: linear (a square would be 16x)
    below = memory.evaluation_bytes(fox, FLASH_FOX_MIN_LENGTH - 1, 1)
    plain = memory.evaluation_bytes(_config(positional="none", attention="softmax"), FLASH_FOX_MIN_LENGTH - 1, 1)
    assert below > plain  # below the threshold FoX still forms its blocks of queries x keys
