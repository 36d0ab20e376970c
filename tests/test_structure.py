"""Structure the code promises: the public API, the layering, documented hooks."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

import rlm_graph
from rlm_graph.hooks import HookSpecs

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rlm_graph"
PURE = [
    "graph",
    "protocol",
    "repl",
    "events",
    "report",
    "limits.py",
    "contracts.py",
    "images.py",
    "errors.py",
    "routing.py",
    "concurrency/adaptive.py",
    "hedging/policy.py",
    "journal",
    # the evaluation's data, scoring, statistics and pages (its runner uses the batch layer)
    "eval/items.py",
    "eval/scoring.py",
    "eval/stats.py",
    "eval/tasks",
    "eval/convert",
    "eval/table.py",
    "eval/page.py",
]
FORBIDDEN = {"trio", "httpx", "opentelemetry", "outcome"}


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for all the tests here."""
    return ast.parse(path.read_text(), str(path))


def test_public_api_is_sorted_and_importable() -> None:
    assert rlm_graph.__all__ == sorted(rlm_graph.__all__)
    for name in rlm_graph.__all__:
        assert getattr(rlm_graph, name) is not None


def _imports(path: Path) -> set[str]:
    tree = _parsed(path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
            elif node.module:
                found.add("." * node.level + node.module)
    return found


def test_the_pure_layer_imports_no_runtime() -> None:
    offenders = []
    for entry in PURE:
        paths = (
            [PACKAGE / entry] if entry.endswith(".py") else sorted((PACKAGE / entry).rglob("*.py"))
        )
        for path in paths:
            imported = _imports(path)
            bad = (imported & FORBIDDEN) | {
                m
                for m in imported
                if m.lstrip(".").split(".")[0] in ("runtime", "engine", "rlm", "tracing", "cli")
            }
            if bad:
                offenders.append(f"{path.relative_to(ROOT)}: {sorted(bad)}")
    assert not offenders, offenders


def test_only_the_runtime_and_facade_import_trio() -> None:
    allowed = (
        "runtime",
        "_http",
        "doors",
        "concurrency/capacity.py",
        "concurrency/limiter.py",
        "concurrency/tokens.py",
        "concurrency/threads.py",
        "hedging/race.py",
        "batch/complete.py",
        "engine.py",
        "rlm.py",
        "cli",
        "testing",
        "tracing",
    )
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        if "trio" in _imports(path) and not relative.startswith(allowed):
            offenders.append(relative)
    assert not offenders, offenders


def test_every_hook_is_documented() -> None:
    doc = (ROOT / "docs" / "plugins.md").read_text()
    hooks = [name for name in vars(HookSpecs) if name.startswith("rlm_")]
    assert hooks
    missing = [name for name in hooks if f"`{name}`" not in doc and f"`{name}(" not in doc]
    assert not missing, missing


def _imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, by full dotted name (absolute imports only)."""
    found: set[str] = set()
    for node in ast.walk(_parsed(path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_plugins_and_examples_use_only_the_public_api() -> None:
    """First-party plugins and the example third-party plugin import what any stranger's
    plugin may: never ``rlm_graph.runtime``, ``rlm_graph._http`` or ``rlm_graph.doors``
    (private; `rlm_graph.http` and `rlm_graph.executors` are the doors)."""
    files = sorted((ROOT / "plugins").rglob("*.py")) + sorted((ROOT / "examples").rglob("*.py"))
    assert len(files) > 10
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        for name in sorted(_imported_modules(path))
        if name.split(".")[:2]
        in (["rlm_graph", "runtime"], ["rlm_graph", "_http"], ["rlm_graph", "doors"])
    ]
    assert not offenders, offenders


HEAVY = ("trio", "httpx", "opentelemetry", "networkx", "h11", "pluggy")


def _loaded_after(statement: str) -> list[str]:
    script = f"import sys; {statement}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [m for m in done.stdout.strip().split(",") if m]


@pytest.mark.processes
def test_import_rlm_graph_is_cheap_and_names_load_on_use() -> None:
    """The public names load their modules on first use: ``import rlm_graph`` (and the
    pure ``rlm_graph.repl`` the subprocess guest needs) pulls in no engine libraries."""
    assert _loaded_after("import rlm_graph") == []
    assert _loaded_after("import rlm_graph.repl, rlm_graph.contracts, rlm_graph.errors") == []
    assert "trio" in _loaded_after("import rlm_graph; rlm_graph.RLM")
    assert set(dir(rlm_graph)) >= set(rlm_graph.__all__)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _internal_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``rlm_graph`` that ``path`` imports, wherever the import stands (at
    the top, under ``TYPE_CHECKING``, or inside a function)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = _parsed(path)
    lazy = any(isinstance(n, ast.Name) and n.id == "lazy_names" for n in ast.walk(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from . import a, b` imports the modules a and b; `from .m import X`, m.
            named = {f"{base}.{alias.name}" for alias in node.names} & modules
            found.update(named or ({base} & modules))
        elif lazy and isinstance(node, ast.Constant) and isinstance(node.value, str):
            # A lazy export (`_lazy.lazy_names`): ".engine" is imported on first use.
            if node.value.startswith(".") and f"{package}{node.value}" in modules:
                found.add(f"{package}{node.value}")
    found.discard(name)
    return found


def test_no_import_cycle_in_rlm_graph() -> None:
    """Every import counts, lazy or for type checking only: a cycle is two modules that
    each need the other, whatever hides it from the interpreter."""
    import networkx as nx

    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(path) for path in paths}
    graph = nx.DiGraph()
    for path in paths:
        graph.add_edges_from(
            (_module_name(path), target) for target in _internal_imports(path, modules)
        )
    cycles = sorted((sorted(c) for c in nx.simple_cycles(graph)), key=len)
    assert not cycles, [" -> ".join(c) for c in cycles[:10]]


def test_modules_and_functions_stay_small() -> None:
    """A module past 600 lines wants a folder, a function past 60 lines named stages
    (docs/architecture.md); `RLM.__init__` takes the reference library's keywords."""
    allowed = {"rlm_graph/rlm.py:RLM.__init__"}
    big = []
    for path in sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "plugins").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        source = path.read_text()
        if source.count("\n") > 600:
            big.append(f"{relative}: {source.count(chr(10))} lines")
        tree = _parsed(path)
        for parent in ast.walk(tree):
            for node in ast.iter_child_nodes(parent):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    owner = f"{parent.name}." if isinstance(parent, ast.ClassDef) else ""
                    where = f"{relative}:{owner}{node.name}"
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > 60 and where not in allowed:
                        big.append(f"{where}: {length} lines")
    assert not big, big


def test_the_runtime_is_only_the_scheduler() -> None:
    lines = sum(p.read_text().count("\n") for p in (PACKAGE / "runtime").rglob("*.py"))
    assert lines < 3000, f"rlm_graph/runtime/ has {lines} lines"
