"""The package's layering: no import cycle, the library importable without the CLI, a thin CLI."""

import pytest
import ast
import re
import subprocess
import sys
from pathlib import Path

import spe

SRC = Path(spe.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """spe module -> spe modules it imports anywhere in its source (lazy imports included)."""
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                # `from pkg import sub` imports the submodule pkg.sub when there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


@pytest.mark.slow
def test_the_package_has_no_import_cycle():
    graph = _import_graph()
    assert {"spe.lab.cli.main", "spe.lab.music.evaluation.report", "spe.lab.music.plan"} <= set(graph)
    assert _find_cycle(graph) is None, " -> ".join(_find_cycle(graph))


def test_the_cycle_finder_finds_cycles():
    # the check above would pass vacuously if _find_cycle never reported anything
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


@pytest.mark.slow
def test_only_the_cli_imports_the_cli():
    graph = _import_graph()
    users = {name for name, edges in graph.items() if any(e.startswith("spe.lab.cli") for e in edges)}
    assert users <= {n for n in graph if n.startswith("spe.lab.cli") or n == "spe.__main__"}


@pytest.mark.slow
def test_library_imports_without_the_cli():
    code = ("import sys, spe.lab.music.evaluation, spe.lab.metrics, spe.lab.music.plan, spe.lab.music.generation; "
            "import spe.lab.music.evaluation.report; "
            "print(sorted(m for m in sys.modules if m.startswith('spe.lab.cli')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_the_library_never_imports_the_lab():
    graph = _import_graph()
    library = {name for name in graph if not name.startswith("spe.lab") and name != "spe.__main__"}
    assert {"spe.ops.linear", "spe.encodings.sine", "spe.attention.layer", "spe.checkpoint"} <= library
    offenders = {name: sorted(e for e in graph[name] if e.startswith("spe.lab")) for name in library}
    assert not {name: edges for name, edges in offenders.items() if edges}


@pytest.mark.slow
def test_import_spe_loads_no_experiment_dependency():
    extras = ("music21", "miditok", "symusic", "matplotlib", "sklearn", "tensorboard", "spe.lab")
    code = ("import sys, spe, spe.checkpoint, spe.generation; "
            f"print(sorted({{m.split('.')[0] if not m.startswith('spe.') else m for m in sys.modules}} & {set(extras)!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_python_dash_m_spe_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "spe", "--help"], capture_output=True, text=True, check=True)
    assert "usage: spe" in done.stdout and "report" in done.stdout


def test_the_real_homes_of_moved_names_import():
    from spe.lab.music.evaluation.publish import publish_report
    from spe.lab.music.evaluation.r_grid import r_grids
    from spe.lab.music.evaluation.report import build_report
    from spe.lab.music.plan import results_table, summarize_runs
    from spe.lab import plans
    from spe.lab.plans import load_plan
    from spe.lab.metrics.pe_probe import pe_metrics, probe_plan, probe_tokens
    from spe.models.trunk import Trunk, init_weights
    from spe.ops.sine import FusedSineProduct, SharedSineProduct, sine_features, sine_phase

    assert all(callable(f) for f in (publish_report, r_grids, build_report, load_plan, results_table, plans.run,
                                     summarize_runs, pe_metrics, probe_plan, probe_tokens, init_weights,
                                     sine_features, sine_phase))
    assert isinstance(FusedSineProduct, type) and isinstance(SharedSineProduct, type)
    assert not hasattr(Trunk, "_init_weights")  # one name for one function


@pytest.mark.parametrize("name", ["cosformer", "lrpe", "alibi"])
def test_an_encoding_is_named_only_in_its_file_the_registry_and_the_exports(name):
    # adding or changing an encoding is a change to its own file (its spec and options), the
    # registry's list and the package's exports, not to every module that handles encodings
    files = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if name in p.read_text().lower())
    assert files == sorted([f"encodings/{name}.py", "encodings/registry.py", "encodings/__init__.py"]), files


# The receiver of a method, or torch.autograd.Function's ctx (whose forward takes its inputs
# positionally: Function.apply passes no keywords), does not count as a positional parameter; such
# a forward may take one record of the call's scalars beside its six tensors.
_RECEIVERS = {"self", "cls", "ctx"}
MAX_POSITIONAL = 6


def _long_positional_functions(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            names = [a.arg for a in node.args.posonlyargs + node.args.args]
            limit = MAX_POSITIONAL
            if names and names[0] == "ctx":  # up to six tensors and one record of the call's scalars
                limit += 1
            if names and names[0] in _RECEIVERS:
                names = names[1:]
            if len(names) > limit:
                found.append(f"{where}:{node.lineno} {getattr(node, 'name', 'lambda')} ({len(names)} positional)")
    return found


# sineSPE's apply functions moved to ops/sine from spe.encodings, where they were public with these
# positional signatures: kept so that code calling them from there keeps working.
_PUBLIC_SIGNATURES = {"ops/sine/apply.py": {"apply_sine_code_fused", "apply_sine_code_blocked",
                                            "apply_sine_code_timed", "apply_sine_code_timed_pair"},
                      "ops/sine/naive.py": {"apply_sine_code_timed_reference"}}


def test_no_kernel_takes_more_than_six_positional_parameters():
    # options travel as one typed record (spe.ops.linear_attn.options.LinearKernelOptions) or as
    # keywords, never as a long untyped positional list
    found = [hit for p in sorted((SRC / "ops").rglob("*.py"))
             for hit in _long_positional_functions(p.read_text(), str(p.relative_to(SRC)))
             if hit.split(" ")[1] not in _PUBLIC_SIGNATURES.get(str(p.relative_to(SRC)), ())]
    assert not found, found


def test_the_positional_scan_counts_what_it_should():
    seven = "def f(a, b, c, d, e, f, g, *, h=1): pass"
    assert _long_positional_functions(seven, "x") == ["x:1 f (7 positional)"]
    assert _long_positional_functions("def f(a, b, c, d, e, f, *, g, h): pass", "x") == []
    assert _long_positional_functions("class A:\n    def m(self, a, b, c, d, e, f): pass", "x") == []
    assert len(_long_positional_functions("def f(a, b, /, c, d, e, f, g): pass", "x")) == 1


# The modules directly under spe/ops/ that are no mechanism folder, and why each stays.
OPS_TOP_MODULES = {
    "__init__.py": "spe.ops's public names (docs/api.md), re-exported from the mechanism folders",
    "linear.py": "public alias spe.ops.linear, linear attention's earlier path (now spe.ops.linear_attn)",
    "recurrent.py": "public alias spe.ops.recurrent, the decoding steps' earlier path (now each "
                    "mechanism's recurrent.py)",
}
# Folders of spe/ops/ that hold what the mechanisms share rather than a mechanism of their own.
OPS_SHARED_FOLDERS = {"common"}


def _definitions(source: str) -> list[str]:
    """Names of the functions and classes a module defines at its top level."""
    return [node.name for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def test_ops_reads_one_mechanism_a_folder():
    ops = SRC / "ops"
    loose = sorted(p.name for p in ops.iterdir() if p.is_file() and p.suffix == ".py")
    assert loose == sorted(OPS_TOP_MODULES), f"spe/ops/ modules outside a mechanism folder: {loose}"
    folders = sorted(p for p in ops.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert len(folders) >= 6  # linear_attn, decay, softmax, path, relative, sine, common
    for folder in folders:
        assert (folder / "__init__.py").is_file(), f"{folder.name}/ is no package"
        if folder.name not in OPS_SHARED_FOLDERS:
            # every mechanism has its slow reference twin (fla's naive.py)
            assert (folder / "naive.py").is_file(), f"ops/{folder.name}/ has no naive.py reference"


def _decay_mode_comparisons(source: str) -> list[int]:
    """Lines that compare something with a decay mode's name (a string switch on the decay)."""
    from spe.ops.decay import DECAY_MODES

    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Compare)
            and any(isinstance(c, ast.Constant) and c.value in DECAY_MODES
                    or isinstance(c, ast.Name) and c.id == "NO_DECAY" for c in [node.left, *node.comparators])]


def test_the_layer_reaches_its_decay_through_the_registry():
    # each mode is an object of spe.attention.decays (built once, called through one interface)
    from spe.attention.decays import DECAYS
    from spe.ops.decay import DECAY_MODES

    assert tuple(DECAYS) == DECAY_MODES
    layer = (SRC / "attention" / "layer.py").read_text()
    assert _decay_mode_comparisons(layer) == []
    assert _decay_mode_comparisons("if self.decay == 'learned':\n    pass\nelif 'gated' != d: pass") == [1, 3]
    assert _decay_mode_comparisons("if d is NO_DECAY: pass\nif d == 'linear': pass") == [1]


# The public aliases at earlier paths: for user code only, never imported by the library itself.
SHIMS = {"spe.ops.linear", "spe.ops.recurrent"}


def test_the_library_imports_no_shim():
    importers = sorted(f"{name} imports {sorted(edges & SHIMS)}"
                       for name, edges in _import_graph().items() if edges & SHIMS)
    assert importers == [], importers
    assert SHIMS == {_module_name(SRC / "ops" / name) for name in OPS_TOP_MODULES if name != "__init__.py"}


def test_the_ops_shims_only_re_export():
    # a shim that grew code of its own would be a second home for a kernel
    for name in sorted(OPS_TOP_MODULES):
        assert _definitions((SRC / "ops" / name).read_text()) == [], name
    assert _definitions("import x\n__all__ = ['x']\n") == []
    assert _definitions("def f(): pass\nclass A: pass\n") == ["f", "A"]


# SPE's mathematics lives with its kernels in ops/sine; the encodings keep the nn.Modules.
# convSPE's blocked application stays in encodings/filter.py beside the filter that picks it.
_SPE_MODULES = ("filter.py", "sine.py", "clock.py")
_MATH_OUTSIDE_OPS = {"apply_conv_code_blocked"}


def test_spe_apply_functions_and_references_live_in_ops_sine():
    import importlib

    import spe.ops.sine as sine_ops

    defined = {name: module for module in _SPE_MODULES
               for name in _definitions((SRC / "encodings" / module).read_text())
               if (name.startswith("apply_") or name.endswith("_reference") or "gate_term" in name
                   or name == "clock_times") and name not in _MATH_OUTSIDE_OPS}
    assert defined == {}, defined
    # the earlier public paths still give the same functions
    for module in _SPE_MODULES:
        encoding = importlib.import_module(f"spe.encodings.{module[:-3]}")
        for name in encoding.__all__:
            if hasattr(sine_ops, name):
                assert getattr(encoding, name) is getattr(sine_ops, name), f"{module}: {name}"
    assert {"apply_code", "apply_code_reference", "clock_reference",
            "apply_sine_code_timed_reference"} <= set(sine_ops.__all__)


# A decay's rank names its form ((H,) constant, (B, L, H) a gate per head, (B, L, H, M) per
# channel): read in spe.ops.decay.forms alone, everything else asks it (decode_decay, given_form).
_DECAY_RANK = re.compile(r"\b\w*decay\w*\.(dim\(\)|ndim|shape)")


def test_only_the_decay_forms_read_a_decays_rank():
    readers = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                     if p != SRC / "ops" / "decay" / "forms.py" and _DECAY_RANK.search(p.read_text()))
    assert readers == [], readers
    assert _DECAY_RANK.search("if log_decay.dim() == 4:") and _DECAY_RANK.search("key_log_decay.shape[1]")
    assert not _DECAY_RANK.search("decay_form(log_decay)")


TASKS = ("spe.lab.music", "spe.lab.lra", "spe.lab.synth")


def _task_of(module: str) -> str | None:
    return next((t for t in TASKS if module == t or module.startswith(t + ".")), None)


def test_the_engine_knows_no_task_and_no_task_imports_another():
    """One engine under tasks as packages: the engine and the plan runner import no task (plans.py
    reaches them through PLAN_TASKS when a plan runs), and a task imports only the lab's shared
    modules, never another task."""
    graph = _import_graph()
    assert {"spe.lab.engine.core", "spe.lab.plans", "spe.lab.music.plan", "spe.lab.lra.study",
            "spe.lab.synth.study"} <= set(graph)
    shared = [n for n in graph if n.startswith("spe.lab.engine") or n in ("spe.lab.plans", "spe.lab.options",
                                                                             "spe.lab.experiment", "spe.lab.outputs",
                                                                             "spe.lab.model_defaults")]
    offenders = {n: sorted(e for e in graph[n] if _task_of(e)) for n in shared}
    assert not {n: e for n, e in offenders.items() if e}, offenders
    crossing = {n: sorted(e for e in edges if _task_of(e) and _task_of(e) != _task_of(n))
                for n, edges in graph.items() if _task_of(n)}
    assert not {n: e for n, e in crossing.items() if e}, crossing
