"""Hostile inputs: a one-line error naming the file or value, exit status 2, nothing overwritten."""

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
from conftest import write_midi
from tiny_run import clean_midi, rewrite_header, tiny_config, toml_text

from spe.lab.cli.main import main
from spe.lab.options import MAX_THREADS
from spe.lab.music.train import train

# The existing run: ape-learned with 40 position embeddings, trained at length 32.
MODEL = {"positional": "ape-learned", "attention": "softmax", "max_positions": 40, "dropout": 0.0}


def _snapshot(root: Path) -> dict:
    """path -> (bytes, mtime) of every file below root, the token cache left out."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and "cache" not in p.parts}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained run, config files, checkpoints, prompts and data folders of every hostile kind."""
    root = tmp_path_factory.mktemp("hostile")
    cfg = tiny_config(root, "run", model=MODEL)
    train(cfg, progress=False)
    (root / "run.toml").write_text(toml_text(cfg))
    good = toml_text(cfg)
    (root / "unknown.toml").write_text("bogus = 1\n" + good)
    (root / "unknown_model.toml").write_text(good + "d_modle = 32\n")
    (root / "steps_str.toml").write_text(good.replace("steps = 6", 'steps = "ten"'))
    (root / "lr_list.toml").write_text(good.replace("lr = 0.003", "lr = [1]"))
    (root / "threads_neg.toml").write_text(good.replace("threads = 1", "threads = -1"))
    (root / "huge_conv.toml").write_text(good + f"short_conv = {2 ** 63 - 1}\n")  # [model] is the last table
    checkpoint = root / "run" / "model.safetensors"
    rewrite_header(checkpoint, root / "future", spe_format_version="99")
    rewrite_header(checkpoint, root / "other", config={"d_model": 64})
    for name, value in HEADER_CASES.items():
        rewrite_header(checkpoint, root / name, config={"vocab_size": value})
    rewrite_header(checkpoint, root / "layers_1e9", config={"num_layers": 10 ** 9})
    rewrite_header(checkpoint, root / "step_str", spe_metadata=json.dumps({"step": "six"}))
    (root / "broken.mid").write_bytes(b"MThd\x00\x00\x00\x06not a midi file at all")
    write_midi(root / "long_prompt.mid", notes=60)
    for i in range(2):
        (root / "corrupt" / f"bad{i}.mid").parent.mkdir(exist_ok=True)
        (root / "corrupt" / f"bad{i}.mid").write_bytes(b"MThd garbage" * (i + 1))
    (root / "empty").mkdir()
    (root / "empty" / "zero_bytes.mid").write_bytes(b"")
    write_midi(root / "empty" / "no_notes.mid", notes=0)
    clean_midi(root / "user")
    return root, cfg


def _train(root, cfg, toml="run", *flags):
    """spe train with the config file ``root/TOML.toml`` on the tiny corpus."""
    return ["train", "--config", f"{root}/{toml}.toml", "--data", cfg.data, "--cache-dir", cfg.cache_dir,
            "--no-progress", *flags]


def _run(root, *flags):
    return ["--out", f"{root}/run", *flags]


def _new(root, *flags):
    return ["--out", f"{root}/new", *flags]


# Checkpoint headers of the wrong JSON type, and one claiming a vocabulary of 10^12 (4 TB of
# float32 per model dimension: allocating it would fail with a RuntimeError, not this message).
HEADER_CASES = {"vocab_str": "x", "vocab_list": [300], "vocab_bool": True, "vocab_1e12": 10 ** 12}


def _evaluate(root, name):
    return ["evaluate", "--checkpoint", f"{root}/{name}", *_run(root)]


def _generate(root, *flags):
    return ["generate", "--checkpoint", f"{root}/run", "--length", "4", "--out", f"{root}/run/x.mid", *flags]


# (id, argv from (root, cfg), the message as a regex, files allowed to change)
CASES = [
    ("unknown config key", lambda r, c: _train(r, c, "unknown", *_run(r)),
     r"config file .*unknown\.toml: unknown training option\(s\) \['bogus'\]; known: \[.*'batch_size'", ()),
    ("unknown model key", lambda r, c: _train(r, c, "unknown_model", *_run(r)),
     r"unknown_model\.toml: unknown model option\(s\) \['d_modle'\]; known: \[.*'d_model'", ()),
    ("wrong type (string steps)", lambda r, c: _train(r, c, "steps_str", *_run(r)),
     r"steps_str\.toml: training option steps must be an integer, got 'ten' \(str\)", ()),
    ("wrong type (list lr)", lambda r, c: _train(r, c, "lr_list", *_run(r)),
     r"lr_list\.toml: training option lr must be a number, got \[1\] \(list\)", ()),
    ("threads -1 in a config file", lambda r, c: _train(r, c, "threads_neg", *_new(r)),
     r"threads_neg\.toml: threads must be 0 \(PyTorch's default\) or a positive number of CPU threads up to \d+ "
     r"\(the CPUs this process may use\), got -1 "
     r"\(options of that file and the command line\)$", ()),
    ("train_state.pt as checkpoint",
     lambda r, c: ["evaluate", "--checkpoint", f"{r}/run/train_state.pt", *_run(r)],
     r"train_state\.pt is a training state .*not a model: pass the run folder .*/run "
     r"or its model\.safetensors",
     ()),
    ("newer checkpoint format", lambda r, c: ["evaluate", "--checkpoint", f"{r}/future", *_run(r)],
     r"future/model\.safetensors has checkpoint format version 99, newer than the 1 this spe reads", ()),
    ("checkpoint of another configuration",
     lambda r, c: ["generate", "--checkpoint", f"{r}/other", "--out", f"{r}/run/x.mid"],
     r"other/model\.safetensors: its tensors do not match its configuration \(.* has shape", ()),
    ("resume with another configuration",
     lambda r, c: _train(r, c, "run", *_run(r, "--resume", "--d-model", "64")),
     r"--resume: \S+/run was trained with d_model 32; --d-model gives 64: leave it out", ()),
    ("--out holds another configuration", lambda r, c: _train(r, c, "run", *_run(r, "--d-model", "64")),
     r".*/run holds a run of another configuration \(d_model 32 -> 64\): choose another --out, "
     r"or pass --overwrite", ()),
    ("--out holds the same configuration", lambda r, c: _train(r, c, "run", *_run(r)),
     r".*/run already holds a checkpoint: pass --resume to continue it, --overwrite", ()),
    ("unreadable prompt", lambda r, c: ["generate", "--checkpoint", f"{r}/run", "--prompt", f"{r}/broken.mid",
                                        "--length", "4", "--out", f"{r}/run/x.mid"],
     r"cannot read prompt MIDI .*broken\.mid", ()),
    ("prompt longer than allowed",
     lambda r, c: ["generate", "--checkpoint", f"{r}/run", "--prompt", f"{r}/long_prompt.mid",
                   "--prompt-bars", "100", "--length", "4", "--out", f"{r}/run/x.mid"],
     r"the prompt .*long_prompt\.mid \(\d+ tokens\) plus --length 4 needs \d+ positions "
     r"but .*run takes 40 learned",
     ()),
    ("every data file corrupt", lambda r, c: _train(r, c, "run", *_new(r, "--data", f"{r}/corrupt")),
     r"no readable MIDI file with notes in .*corrupt \(2 tried\)", ()),
    ("zero-length pieces", lambda r, c: _train(r, c, "run", *_new(r, "--data", f"{r}/empty")),
     r"no readable MIDI file with notes in .*empty \(2 tried\)", ()),
    ("length above the positional encoding (evaluate)",
     lambda r, c: ["evaluate", "--checkpoint", f"{r}/run", "--data", f"{r}/user", "--cache-dir", c.cache_dir,
                   *_run(r)],
     r"the default length 96 needs 96 positions but .*run takes 40 learned position embeddings", ()),
    ("length above the positional encoding (generate)",
     lambda r, c: ["generate", "--checkpoint", f"{r}/run", "--length", "50", "--out", f"{r}/run/x.mid"],
     r"--length 50 needs 50 positions but .*run takes 40 learned position embeddings", ()),
    ("fp16 on CPU", lambda r, c: _train(r, c, "run", *_new(r, "--precision", "fp16")),
     r"precision fp16 needs a CUDA device", ()),
    ("keep no checkpoint", lambda r, c: _train(r, c, "run", *_new(r, "--keep-checkpoints", "0")),
     r"--keep-checkpoints must be a positive integer, got 0", ()),
    # threads beyond the machine's CPUs crashed (a segfault at 100,000, libgomp's abort at 20,000)
    *[(f"--threads {n} ({command})", lambda r, c, n=n, argv=argv: [*argv(r, c), "--threads", str(n)],
       rf"--threads must be 0 \(PyTorch's default\) or a positive number of CPU threads up to {MAX_THREADS} "
       rf"\(the CPUs this process may use\), got {n}$", ())
      for n in (-1, MAX_THREADS + 1, 100000)
      for command, argv in [("train", lambda r, c: _train(r, c, "run", *_new(r))),
                            ("demo", lambda r, c: ["demo", "--out", f"{r}/new"]),
                            ("bench", lambda r, c: ["bench", "--out", f"{r}/new"]),
                            ("lra", lambda r, c: ["lra", "--task", "listops", "--data", f"{r}/none", "--out",
                                                  f"{r}/new"]),
                            ("synth", lambda r, c: ["synth", "--task", "flip-flop", "--out", f"{r}/new"]),
                            ("sweep", lambda r, c: ["sweep", "--out", f"{r}/new"]),
                            ("evaluate", lambda r, c: _evaluate(r, "run")),
                            ("generate", lambda r, c: _generate(r)),
                            ("report", lambda r, c: ["report", "--checkpoint", f"{r}/run", "--out", f"{r}/new"])]],
    *[(f"--temperature {t}", lambda r, c, t=t: _generate(r, f"--temperature={t}"),
       rf"--temperature must be a finite positive number, got {shown}$", ())
      for t, shown in [("nan", "nan"), ("inf", "inf"), ("-inf", "-inf"), ("0", "0.0")]],
    ("--top-p nan", lambda r, c: _generate(r, "--top-p", "nan"), r"--top-p must be in \(0, 1\], got nan$", ()),
    ("--window -1 (evaluate)", lambda r, c: [*_evaluate(r, "run"), "--window", "-1"],
     r"--attention-window must be 0 \(the whole past\) or a positive number of positions, got -1$", ()),
    ("--window -1 (generate)", lambda r, c: _generate(r, "--window", "-1"),
     r"--attention-window must be 0 \(the whole past\) or a positive number of positions, got -1$", ()),
    ("--attention-window -1", lambda r, c: _train(r, c, "run", *_new(r, "--attention-window", "-1")),
     r"--attention-window must be 0 \(the whole past\) or a positive number of positions, got -1$", ()),
    ("--max-piece-tokens 0", lambda r, c: _train(r, c, "run", *_new(r, "--max-piece-tokens", "0")),
     r"--max-piece-tokens must be .*, got 0$", ()),
    ("header: vocab_size a string", lambda r, c: _evaluate(r, "vocab_str"),
     r"vocab_str/model\.safetensors: header spe_config\.vocab_size must be an integer, got 'x' \(str\)$", ()),
    ("header: vocab_size a list", lambda r, c: _evaluate(r, "vocab_list"),
     r"vocab_list/model\.safetensors: header spe_config\.vocab_size must be an integer, got \[300\] \(list\)$",
     ()),
    ("header: vocab_size a bool", lambda r, c: _evaluate(r, "vocab_bool"),
     r"vocab_bool/model\.safetensors: header spe_config\.vocab_size must be an integer, got True \(bool\)$", ()),
    ("header: vocab_size 10^12", lambda r, c: _evaluate(r, "vocab_1e12"),
     r"vocab_1e12/model\.safetensors: its tensors do not match its configuration \(\S+ has shape "
     r"\(\d+, 32\), the configuration gives \(1000000000000, 32\); header spe_config: vocab_size = 1000000000000\)",
     ()),
    ("header: num_layers 10^9", lambda r, c: _evaluate(r, "layers_1e9"),
     r"layers_1e9/model\.safetensors: header spe_config\.num_layers = 1000000000, but the file holds \d+ tensors", ()),
    ("header: step a string", lambda r, c: _evaluate(r, "step_str"),
     r"step_str/model\.safetensors: header spe_metadata\.step must be an integer or null, got 'six' \(str\)$", ()),
    # outputs never among the data read; sizes checked against the machine before allocating
    ("evaluate --json on a piece of its data", lambda r, c: [*_evaluate(r, "run"), "--json", f"{c.data}/piece0.mid"],
     r"--json \S+/piece0\.mid is inside the data folder \S+ this command reads: choose a path outside it", ()),
    ("evaluate --out its data folder", lambda r, c: ["evaluate", "--checkpoint", f"{r}/run", "--out", c.data],
     r"--out \S+ is the data folder \S+ this command reads", ()),
    ("evaluate --out inside --data", lambda r, c: ["evaluate", "--checkpoint", f"{r}/run", "--data", f"{r}/user",
                                                   "--out", f"{r}/user/eval"],
     r"--out \S+/user/eval is inside the data folder \S+/user this command reads", ()),
    ("--prompt-bars 10^9", lambda r, c: _generate(r, "--prompt", f"{r}/long_prompt.mid", "--prompt-bars", "1000000000"),
     r"the prompt \S+long_prompt\.mid \(\d+ tokens\) plus --length 4 needs \d+ positions", ()),
    ("--short-conv 10^10", lambda r, c: _train(r, c, "run", *_new(r, "--short-conv", str(10 ** 10))),
     r"the model needs at least \S+ [TP]B \(weights, gradients and AdamW moments .* but cpu memory is .*: lower its "
     r"sizes \(.*short_conv 10,000,000,000", ()),
    ("d_ff 10^11", lambda r, c: _train(r, c, "run", *_new(r, "--model-option", "d_ff=100000000000")),
     r"the model needs at least .*d_ff 100,000,000,000", ()),
    ("num_realizations 10^10", lambda r, c: _train(r, c, "run", *_new(r, "--positional", "sinespe", "--attention",
                                                                      "linear-elu", "--model-option",
                                                                      "num_realizations=10000000000")),
     r"the model needs at least .*num_realizations 10,000,000,000\)$", ()),
    ("short_conv 2^63 - 1 in a config", lambda r, c: _train(r, c, "huge_conv", *_new(r)),
     r"the model's sizes cannot be allocated on any machine \(.*\): lower them$", ()),
    ("NaN loss", lambda r, c: _train(r, c, "run", *_run(r, "--resume", "--steps", "12", "--lr", "1e30")),
     r"training stopped: the loss is (nan|inf) at step \d+ .*; the last good checkpoint is "
     r".*run/model\.safetensors \(step 6\), left as it was", ("run/metrics.jsonl",)),
]


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "message", "may_change"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_exit_2_and_nothing_is_overwritten(world, argv, message, may_change,
                                                                      capsys):
    root, cfg = world
    shutil.rmtree(root / "new", ignore_errors=True)
    before = _snapshot(root)
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # skipped files are warned about, before the error
        assert main(argv(root, cfg)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"spe {argv(root, cfg)[0]}: error: "), err
    assert re.search(message, err[0]), err[0]
    after = _snapshot(root)
    for name in may_change:
        before.pop(name, None), after.pop(name, None)
    assert after == before


def test_a_tiny_temperature_generates_the_greedy_continuation(world, tmp_path, capsys):
    """--temperature 1e-40 overflowed float32 (a traceback); it is now the t → 0 limit: any seed, same music."""
    root, _ = world
    outs = [tmp_path / f"seed{seed}.mid" for seed in (1, 2)]
    for seed, out in zip((1, 2), outs):
        assert main(["generate", "--checkpoint", f"{root}/run", "--length", "12", "--temperature", "1e-40",
                     "--seed", str(seed), "--out", str(out), "--no-progress"]) == 0
    assert outs[0].read_bytes() == outs[1].read_bytes()


@pytest.mark.slow
def test_a_hostile_data_folder_trains_with_every_skip_named_and_counted(world, tmp_path):
    """A non-UTF-8 name, folder links (one a cycle) and over-long pieces no longer stop or silently shrink a run."""
    import os

    from spe.checkpoint import load_metadata

    root, cfg = world
    data = tmp_path / "data"
    clean_midi(data / "real", pieces=4)
    os.rename(os.fsencode(data / "real" / "piece0.mid"), os.fsencode(data / "real") + b"/bad\xff.mid")
    clean_midi(tmp_path / "elsewhere", pieces=2)
    (data / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (data / "real" / "loop").symlink_to(data, target_is_directory=True)
    argv = ["train", "--config", f"{root}/run.toml", "--data", str(data), "--cache-dir", str(tmp_path / "cache"),
            "--out", str(tmp_path / "out"), "--steps", "1", "--max-piece-tokens", "200", "--no-progress"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(argv) == 0
    messages = [str(w.message) for w in caught]
    assert any(m.startswith(f"skipped 1 path(s) in {data} reached a second time through symbolic links")
               and m.endswith("real/loop") for m in messages), messages
    assert any(m.startswith(f"cropped MIDI file {data}/real/bad\\xff.mid ") and "200 tokens" in m for m in messages)
    assert any(m.startswith("cropped 6 of 6 MIDI files") and str(data) in m and "200" in m for m in messages)
    assert load_metadata(tmp_path / "out")["train"]["max_piece_tokens"] == 200


def _fifo_folder_device_loop(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    return {"fifo": ("is a FIFO \\(named pipe\\)", tmp_path / "fifo"),
            "folder": ("is a folder", tmp_path / "folder"), "/dev/zero": ("is a device file", Path("/dev/zero")),
            "link loop": ("is a symbolic link loop", tmp_path / "loop")}


@pytest.mark.parametrize("what", ["fifo", "folder", "/dev/zero", "link loop"])
@pytest.mark.parametrize("command", ["train --config", "generate --prompt", "evaluate --checkpoint", "sweep --plan",
                                     "lra --plan"])
def test_a_path_that_is_no_file_is_named_as_what_it_is(tmp_path, capsys, what, command):
    kind, path = _fifo_folder_device_loop(tmp_path)[what]
    name, flag = command.split()
    argv = {"generate": ["--checkpoint", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.mid")],
            "evaluate": ["--out", str(tmp_path / "eval")]}.get(name, ["--out", str(tmp_path / "out")])
    if name == "generate":  # the prompt is read after the checkpoint: a real one is needed
        pytest.importorskip("symusic")
        from spe.lab.music.generation import prompt_ids

        with pytest.raises(ValueError, match=f"^prompt file {re.escape(str(path))} {kind}$"):
            prompt_ids(None, path, 2)
        return
    if name == "evaluate" and what == "folder":
        kind = "no checkpoint at"  # a folder is a run folder: its model.safetensors is missing
    assert main([name, flag, str(path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(kind, err) and "does not exist" not in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "eval").exists()


@pytest.mark.parametrize("text,message", [
    (b"steps = 5\n# \xff\n", r"config file \S+bad\.toml is not UTF-8 text \(byte 0xff at offset 12\)$"),
    (b"a = " + b"[" * 5000 + b"]" * 5000 + b"\n", r"config file \S+bad\.toml nests arrays or tables too deeply"),
])
def test_a_config_file_that_cannot_be_read_is_one_line_naming_it(tmp_path, capsys, text, message):
    (tmp_path / "bad.toml").write_bytes(text)
    assert main(["train", "--config", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


@pytest.mark.parametrize("argv,message", [
    (["train", "--seed", str(10 ** 20)], r"--seed must be an integer in \[0, 2\*\*63 - 1\], got 10{20}$"),
    (["generate", "--checkpoint", "x", "--seed", "-1"], r"--seed must be an integer in \[0, 2\*\*63 - 1\], got -1$"),
    (["generate", "--checkpoint", "x", "--prompt-bars", "0"], r"--prompt-bars must be positive, got 0$"),
    (["train", "--positional", "sinespe", "--gated", "--model-option", "gate_init=nan"],
     r"gate_init must be a finite number \(a gate logit\), got nan$"),
    (["train", "--model-option", "x=" + "[" * 5000 + "]" * 5000],
     r"--model-option x: VALUE must be a number, true, false or a string"),
])
def test_values_refused_before_any_work(tmp_path, capsys, argv, message):
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_a_billion_prompt_bars_keep_the_whole_prompt_at_once(tmp_path):
    """--prompt-bars 10^9 walked 10^9 bars (minutes at 100 % CPU): past the file's bars, all of it."""
    import time

    pytest.importorskip("miditok")
    from spe.lab.music.corpus import make_tokenizer
    from spe.lab.music.generation import prompt_ids

    write_midi(tmp_path / "p.mid", notes=200)  # 50 bars of 4/4
    tokenizer = make_tokenizer()
    start = time.perf_counter()
    assert prompt_ids(tokenizer, tmp_path / "p.mid", 10 ** 9) == prompt_ids(tokenizer, tmp_path / "p.mid", 51)
    assert time.perf_counter() - start < 5
    assert len(prompt_ids(tokenizer, tmp_path / "p.mid", 2)) < len(prompt_ids(tokenizer, tmp_path / "p.mid", 51))


@pytest.mark.parametrize("options,message", [
    ({"d_ff": 10 ** 11}, r"needs at least \S+ [TP]B .*d_ff 100,000,000,000"),
    ({"short_conv": 10 ** 10}, r"short_conv 10,000,000,000"),
    ({"positional": "sinespe", "attention": "linear-elu", "num_realizations": 10 ** 10}, r"num_realizations 10,"),
    ({"short_conv": 2 ** 63 - 1}, r"cannot be allocated on any machine \(.*overflow"),
])
def test_sizes_beyond_the_machine_are_refused_before_allocating(options, message):
    import torch

    from spe import DecoderLM, ModelConfig
    from spe.lab.engine.memory import check_model_memory

    state = torch.random.get_rng_state()
    with pytest.raises(ValueError, match=message):
        check_model_memory(lambda: DecoderLM(ModelConfig(vocab_size=300, **options)), "cpu", positions=256)
    check_model_memory(lambda: DecoderLM(ModelConfig(vocab_size=300)), "cpu", positions=256)  # the default fits
    assert torch.equal(torch.random.get_rng_state(), state)  # built on the meta device: no random number drawn


@pytest.mark.slow
def test_resuming_a_state_passing_run_without_the_flag_says_so(tmp_path):
    from spe.lab.music.train import train

    model = {"positional": "none", "attention": "linear-elu", "dropout": 0.0}
    cfg = tiny_config(tmp_path, "run", model=model, steps=2, state_passing=True)
    train(cfg, progress=False)
    again = tiny_config(tmp_path, "run", model=model, steps=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(again, resume=True, progress=False)
    assert any(m.startswith(f"--resume: {tmp_path / 'run'} ") and "state passing" in m and "--state-passing" in m
               for m in map(str, (w.message for w in caught)))


def test_an_over_long_listops_row_is_refused_before_padding(tmp_path, capsys):
    """One row of 70,002 tokens padded every sequence to it (3.7 GB a cpu-small step); LRA keeps 2,000."""
    from spe.lab.lra.data.listops import SPLIT_FILES

    row = "[MAX 1 2 ]\t2\n"
    for name in SPLIT_FILES.values():
        (tmp_path / name).write_text("Source\tTarget\n" + row * 4)
    with open(tmp_path / SPLIT_FILES["train"], "a") as f:
        f.write("[MAX " + "1 " * 69_999 + "]\t1\n")
    assert main(["lra", "--task", "listops", "--data", str(tmp_path), "--out", str(tmp_path / "out"), "--steps", "1",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(r"spe lra: error: ListOps: \S+basic_train\.tsv:6 has 70,001 tokens, more than the 2,000 "
                        r"that LRA's pipeline keeps .*pass a length \(spe lra --seq-len N\) to truncate every row to "
                        r"N tokens", err), err
    assert not (tmp_path / "out").exists()
