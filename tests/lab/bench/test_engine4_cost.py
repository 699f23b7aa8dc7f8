"""tools/analysis/engine4_cost.py: a run at tiny sizes measures its cases in their own processes,
stops one over its budget, and --render writes the before/after table into a doc's block."""

import json
from pathlib import Path

import pytest

from conftest import load_tool

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tool():
    return load_tool("tools/analysis/engine4_cost.py", "engine4_cost_tool")


def _record(name, n, ms, mb, status="ok"):
    return {"name": name, "length": n, "status": status, "median_ms": ms, "peak_mb": mb}


def _payload(records, src):
    return {"src": src, "threads": 2, "repeats": 2, "budget_s": 60.0, "memory_limit_mb": 12000.0,
            "load_1min": 0.5, "records": records}


def test_the_table_gives_ratios_before_and_after_and_the_verdicts(tool, tmp_path):
    before = _payload([_record("softmax", 2048, 100, 20), _record("fox", 2048, 2000, 280),
                       _record("model ape", 8192, 3000, 3200), _record("model convspe", 8192, 19500, 3700),
                       _record("model path-fox", 16384, 0, 0, status="over memory (12000 MiB)")], "before/src")
    after = _payload([_record("softmax", 2048, 110, 20), _record("fox", 2048, 165, 30),
                      _record("model ape", 8192, 3000, 3200), _record("model convspe", 8192, 6000, 3500),
                      _record("model path-fox", 16384, 40000, 3900)], "after/src")
    table = tool.render(before, after)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert "20.00× → 1.50×" in rows["fox"] and "14.00× → 1.50×" in rows["fox"] and rows["fox"].endswith("| met |")
    assert "6.50× → 2.00×" in rows["model convspe"] and rows["model convspe"].endswith("| missed |")
    assert "over memory (12000 MiB)" in rows["model path-fox"] and rows["model path-fox"].endswith("| met |")
    assert "`before/src`" in table and "`after/src`" in table

    doc = tmp_path / "cpu.md"
    doc.write_text(f"# page\n{tool.BEGIN}\nold\n{tool.END}\ntail\n")
    paths = []
    for name, payload in (("b.json", before), ("a.json", after)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(payload))
    assert tool.main(["--render", *map(str, paths), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# page\n") and text.endswith("tail\n") and "old" not in text and table in text


def test_user_errors_are_one_line_and_write_nothing(tool, tmp_path, capsys):
    out = tmp_path / "run.json"
    out.write_text("{}")
    assert tool.main(["--out", str(out), "--smoke"]) == 2
    assert out.read_text() == "{}"
    assert tool.main(["--render", str(out), str(tmp_path / "missing.json")]) == 2
    assert tool.main(["--render", str(out), str(out)]) == 2  # "{}": not a run
    run = tmp_path / "real.json"
    run.write_text(json.dumps(_payload([], "src")))
    doc = tmp_path / "page.md"
    doc.write_text("no block\n")
    assert tool.main(["--render", str(run), str(run), "--doc", str(doc)]) == 2
    assert tool.main(["--out", str(tmp_path / "new.json"), "--budget-s", "0"]) == 2
    assert tool.main(["--out", str(tmp_path / "new.json"), "--only", "fox,layr"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 6 and "exists" in errors[0] and "missing.json" in errors[1]
    assert "run.json is not a run" in errors[2] and "--doc" in errors[3] and "--budget-s" in errors[4]
    assert "--only layr" in errors[5]
    assert doc.read_text() == "no block\n" and not (tmp_path / "new.json").exists()


def test_a_smoke_run_measures_each_case_in_its_own_process_and_stops_one_over_budget(tool, tmp_path, monkeypatch):
    cases = [c for c in tool.plan(smoke=True) if (c["name"], c["length"]) in {("softmax", 64), ("layer convspe", 128)}]
    assert len(cases) == 2
    monkeypatch.setattr(tool, "plan", lambda smoke: cases)
    payload = tool.run_all(ROOT / "src", threads=1, repeats=1, budget_s=120, memory_mb=4000, smoke=True,
                           progress=lambda line: None)
    for record in payload["records"]:
        assert record["status"] == "ok" and record["median_ms"] > 0 and record["runs"] == 1
    # a budget no process can meet: recorded as over budget, and the kernel's longer length not run
    longer = dict(cases[0], length=128)
    monkeypatch.setattr(tool, "plan", lambda smoke: [cases[0], longer])
    payload = tool.run_all(ROOT / "src", threads=1, repeats=1, budget_s=0.05, memory_mb=4000, smoke=True,
                           progress=lambda line: None)
    assert [r["status"] for r in payload["records"]] == ["over budget (0 s)", "not run: over at a shorter length"]


@pytest.mark.slow
def test_the_whole_smoke_run_writes_json_and_renders(tool, tmp_path):
    out = tmp_path / "run.json"
    # one case of each kind (kernel as chosen, kernel forced to its old form, model, layer): each case
    # is a process of its own, and the whole list at smoke sizes costs a minute of the suite
    kinds = "fox,path-fox-old,model convspe,model path-fox,layer convspe"
    assert tool.main(["--smoke", "--threads", "1", "--repeats", "1", "--out", str(out), "--only", kinds]) == 0
    payload = json.loads(out.read_text())
    assert {r["name"] for r in payload["records"]} == set(kinds.split(","))
    assert all(r["status"] in ("ok", "n/a") for r in payload["records"])
    doc = tmp_path / "page.md"
    doc.write_text(f"{tool.BEGIN}\n{tool.END}\n")
    assert tool.main(["--render", str(out), str(out), "--doc", str(doc)]) == 0
    assert "| model convspe | 256 |" in doc.read_text()


def test_profile_gives_each_operators_share_of_one_case_and_names_an_unknown_case(tool, capsys):
    assert tool.main(["--smoke", "--profile", "path-fox:128", "--threads", "1", "--rows", "5"]) == 0
    header, *rows = capsys.readouterr().out.strip().splitlines()
    assert header.startswith("path-fox L=128, 1 thread(s)") and len(rows) == 5
    shares = [float(row.split("%")[0]) for row in rows]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 100.0
    assert tool.main(["--smoke", "--profile", "path-fox:999"]) == 2
    assert "--profile 'path-fox:999': no such case" in capsys.readouterr().err
