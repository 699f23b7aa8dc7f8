"""Every finished run records where and how it was made, and study data carry it to the tables."""

import hashlib
import json
import os
import platform
import subprocess
import sys

import pytest
import torch

from spe.lab import plans
from spe.lab.provenance import (ISA_LIMIT_VARIABLES, PROVENANCE_KEYS, config_hash, cpu_isa, isa_caps, provenance,
                                source_state)
from spe.lab.study_data import dirty_runs, read_study, synth_study, write_study
from spe.lab.study_tables import MIXED_MARK, render_study


def _git(folder, *args):
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)


def _repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "a.py").write_text("x = 1\n")
    (repo / "README").write_text("r\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return repo, head


def test_the_commit_is_the_checkouts_and_only_changes_under_the_package_make_it_dirty(tmp_path):
    repo, head = _repo(tmp_path)
    assert source_state(repo / "pkg") == (head, False)
    (repo / "README").write_text("changed\n")  # outside the package: what the run computed is the same
    assert source_state(repo / "pkg") == (head, False)
    (repo / "pkg" / "new.py").write_text("y = 2\n")  # untracked, under the package
    assert source_state(repo / "pkg") == (head, True)
    (repo / "pkg" / "new.py").unlink()
    (repo / "pkg" / "a.py").write_text("x = 2\n")  # tracked, changed
    assert source_state(repo / "pkg") == (head, True)
    outside = tmp_path / "plain"
    outside.mkdir()
    assert source_state(outside) == (None, None)


def test_the_config_hash_is_of_canonical_json():
    assert config_hash({"b": 1, "a": [1, 2]}) == config_hash({"a": [1, 2], "b": 1})
    assert config_hash({"a": 1}) == hashlib.sha256(b'{"a":1}').hexdigest()
    assert config_hash({"a": 1}) != config_hash({"a": 1.5})


def test_the_experiment_hash_leaves_out_where_and_how_a_run_was_carried_out():
    """Two runs of one experiment in other folders, threads, devices or caches share the experiment
    hash (their config hashes differ); any option that changes what is computed changes it."""
    from spe.lab.provenance import experiment_hash

    base = {"seed": 0, "lr": 1e-3, "model": {"positional": "sinespe"}, "out": "runs/a/seed0", "threads": 1,
            "cache_dir": "/c", "device": "cpu", "compile": False, "tensorboard": False, "keep_checkpoints": 2,
            "allow_data_change": False}
    elsewhere = {**base, "out": "runs/reproduce/seed0", "threads": 2, "cache_dir": "/d", "device": "cuda",
                 "compile": True, "tensorboard": True, "keep_checkpoints": 5, "allow_data_change": True}
    assert experiment_hash(elsewhere) == experiment_hash(base) and config_hash(elsewhere) != config_hash(base)
    for changed in ({"seed": 1}, {"lr": 2e-3}, {"model": {"positional": "ape"}}, {"precision": "bf16"}):
        assert experiment_hash({**base, **changed}) != experiment_hash(base), changed
    # only top-level keys are left out: a model option named like one still counts
    assert experiment_hash({**base, "model": {"positional": "sinespe", "out": 1}}) != experiment_hash(base)


def test_a_record_holds_every_key_in_order():
    record = provenance(started=0.0, ended=61.0, config={"device": "cpu", "lr": 1e-3})
    assert tuple(record) == PROVENANCE_KEYS
    assert (record["started"], record["ended"]) == ("1970-01-01T00:00:00Z", "1970-01-01T00:01:01Z")
    assert record["torch"] == torch.__version__ and record["threads"] == torch.get_num_threads()
    assert record["config_sha256"] == config_hash({"device": "cpu", "lr": 1e-3}) and record["device"] == "cpu"
    assert record["experiment_sha256"] == config_hash({"lr": 1e-3})
    assert provenance(started=0.0, ended=0.0)["config_sha256"] is None
    assert provenance(started=0.0, ended=0.0)["experiment_sha256"] is None


def test_the_record_names_the_instruction_sets_and_the_variables_that_cap_them():
    # MKL's matrix products follow the instruction set (an AVX2 and an AVX-512 machine train other
    # weights from one commit and seed), and a VM may report one model name for both: the record must
    # tell them apart, and a cap set in the environment must show in it
    record = provenance(started=0.0, ended=0.0)
    assert record["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["cpu_isa"] == cpu_isa() and record["isa_limits"] == {}
    code = ("import json; from spe.lab.provenance import provenance; r = provenance(started=0.0, ended=0.0); "
            "print(json.dumps([r['cpu_capability'], r['isa_limits']]))")
    env = {k: v for k, v in os.environ.items() if k not in ISA_LIMIT_VARIABLES}
    capped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**env, "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "AVX2"})
    assert json.loads(capped.stdout) == ["DEFAULT", {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}]


@pytest.mark.parametrize("flags, expected", [
    ("fpu sse4_2 avx avx2 fma avx512f avx512bw", "avx512"), ("fpu sse4_2 avx fma avx2", "avx2"),
    ("fpu sse4_2 avx", "avx"), ("fpu sse4_2", "sse4.2")])
def test_cpu_isa_names_the_widest_vector_set_of_the_flags(flags, expected):
    assert cpu_isa(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n") == expected
    # an ARM /proc/cpuinfo has no x86 flags line: the machine type stands in
    assert cpu_isa("processor\t: 0\nFeatures\t: fp asimd\n") == platform.machine()


def test_isa_caps_name_the_environment_a_rerun_needs_to_follow_a_record():
    avx2, avx512 = {"cpu_isa": "avx2", "isa_limits": {}}, {"cpu_isa": "avx512", "isa_limits": {}}
    assert isa_caps(avx2, avx512) == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                                      "ONEDNN_MAX_CPU_ISA": "AVX2"}
    # the same processor, a narrower one (it cannot follow a wider), a record without the field: nothing
    assert isa_caps(avx2, avx2) is None and isa_caps(avx512, avx2) is None and isa_caps({}, avx512) is None
    # a rerun that already ran under those caps is told nothing new
    assert isa_caps(avx2, {**avx512, "isa_limits": isa_caps(avx2, avx512)}) is None
    # a record made under caps of its own: those are what a rerun needs, until it has them
    capped = {**avx512, "isa_limits": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}}
    assert isa_caps(capped, avx512) == {"MKL_ENABLE_INSTRUCTIONS": "AVX2"} and isa_caps(capped, capped) is None


def test_run_once_stores_the_provenance_once_and_keeps_it_on_the_next_call(tmp_path):
    calls = []

    def run(folder):
        calls.append(folder)
        return {"value": 1.0}

    first = plans.run_once(tmp_path / "seed0", run, config=lambda: {"seed": 0, "lr": 0.1})
    assert first["value"] == 1.0 and first["provenance"]["config"] == {"seed": 0, "lr": 0.1}
    assert first["provenance"]["config_sha256"] == config_hash({"seed": 0, "lr": 0.1})
    assert first["provenance"]["started"] <= first["provenance"]["ended"]
    stored = json.loads((tmp_path / "seed0" / plans.RESULT_FILE).read_text())
    assert stored["provenance"] == first["provenance"]
    again = plans.run_once(tmp_path / "seed0", run, config=lambda: {"seed": 0, "lr": 0.1})
    assert again == first and len(calls) == 1


def _results(commits: dict[tuple[str, int], tuple]):
    """(variant, seed) -> (commit or "none", dirty[, cpu]): synthetic results, on processor "CPU-A"
    unless said."""
    out = []
    for (variant, seed), (commit, dirty, *cpu) in commits.items():
        result = {"task": "mqar", "variant": variant, "seed": seed, "train_length": 64, "train_tokens": 10,
                  "params": 5, "results": [{"split": "validation", "length": n, "accuracy": 0.5 + 0.1 * seed
                                            + (0.2 if variant == "x" else 0.0)} for n in (64, 256)]}
        if commit != "none":
            result["provenance"] = {**provenance(started=0.0, ended=1.0, config={"seed": seed}),
                                    "commit": commit, "dirty": dirty, "cpu": cpu[0] if cpu else "CPU-A"}
        out.append(result)
    return out


def test_a_row_whose_seeds_ran_on_two_commits_is_marked_in_its_table():
    results = _results({("x", 0): ("a" * 40, False), ("x", 1): ("a" * 40, False),
                        ("y", 0): ("a" * 40, False), ("y", 1): ("b" * 40, False)})
    records, meta = synth_study(results, study="s", title="t", command="c")
    assert "config" not in meta["provenance"]["y"]["1"] and meta["provenance"]["y"]["1"]["commit"] == "b" * 40
    text = render_study(records, meta)
    assert f"| y{MIXED_MARK} |" in text and "| x |" in text
    line = next(line for line in text.splitlines() if line.startswith("* Provenance"))
    assert "y (seed 0: aaaaaaaaaa on CPU-A, seed 1: bbbbbbbbbb on CPU-A)" in line and "x (" not in line


def test_one_commit_everywhere_is_said_and_no_provenance_is_said_too():
    results = _results({("x", 0): ("a" * 40, False), ("y", 0): ("a" * 40, False)})
    text = render_study(*synth_study(results, study="s", title="t", command="c"))
    assert "each row's seeds ran on one commit and processor (aaaaaaaaaa on CPU-A)" in text and MIXED_MARK not in text
    old = _results({("x", 0): ("none", False), ("y", 0): ("none", False)})
    records, meta = synth_study(old, study="s", title="t", command="c")
    assert "provenance" not in meta
    assert "recorded no commit" in render_study(records, meta)


def test_a_row_whose_seeds_ran_on_two_processors_of_one_commit_is_marked_too():
    """The vendor moves a seed's numbers as a commit does (Bach APE seed 0: AMD against Intel), so a
    row whose seeds ran on two processor models is marked, naming each."""
    results = _results({("x", 0): ("a" * 40, False, "AMD EPYC"), ("x", 1): ("a" * 40, False, "AMD EPYC"),
                        ("y", 0): ("a" * 40, False, "AMD EPYC"), ("y", 1): ("a" * 40, False, "Intel(R) Xeon(R)")})
    text = render_study(*synth_study(results, study="s", title="t", command="c"))
    assert f"| y{MIXED_MARK} |" in text and f"| x{MIXED_MARK} |" not in text
    assert "y (seed 0: aaaaaaaaaa on AMD EPYC, seed 1: aaaaaaaaaa on Intel(R) Xeon(R))" in text


def test_a_seed_without_a_record_beside_recorded_ones_marks_its_row():
    results = _results({("x", 0): ("a" * 40, False), ("x", 1): ("none", False)})
    text = render_study(*synth_study(results, study="s", title="t", command="c"))
    assert f"| x{MIXED_MARK} |" in text and "x (seed 0: aaaaaaaaaa on CPU-A, seed 1: not recorded)" in text


def test_a_study_rerun_part_by_part_lists_seeds_by_commit_and_the_untied_rows_once():
    """A half-rerun study: each mixed row's seeds grouped by commit, rows with no commit at all named once."""
    results = _results({**{("x", s): ("a" * 40, False) for s in (0, 2, 4)},
                        **{("x", s): ("none", False) for s in (1, 3)},
                        **{("y", s): ("a" * 40, False) for s in (0, 1, 2)}, **{("y", s): ("none", False) for s in (3, 4)},
                        **{("z", s): ("none", False) for s in range(3)}, **{("w", s): ("none", False) for s in range(3)}})
    line = next(l for l in render_study(*synth_study(results, study="s", title="t", command="c")).splitlines()
                if l.startswith("* Provenance"))
    assert "x (seeds 0, 2 and 4: aaaaaaaaaa on CPU-A, seeds 1 and 3: not recorded)" in line
    assert "y (seeds 0–2: aaaaaaaaaa on CPU-A, seeds 3 and 4: not recorded)" in line
    assert line.endswith("rows with no commit recorded (runs made before runs kept one): w, z.")
    assert "z (" not in line and "w (" not in line


def test_runs_from_a_dirty_tree_are_refused_unless_allowed(tmp_path):
    results = _results({("x", 0): ("a" * 40, False), ("y", 2): ("a" * 40, True)})
    records, meta = synth_study(results, study="s", title="t", command="c")
    assert dirty_runs(meta) == ["y seed 2"]
    with pytest.raises(ValueError, match=r"uncommitted changes \(y seed 2\).*--allow-dirty"):
        write_study(tmp_path, records, meta)
    assert not list(tmp_path.iterdir())
    write_study(tmp_path, records, meta, allow_dirty=True)
    _, read = read_study(tmp_path, "s")
    assert read["provenance"]["y"]["2"]["dirty"] is True
    assert "aaaaaaaaaa+dirty" in render_study(*read_study(tmp_path, "s"))
