"""Structure the code promises: the public API, the layering, documented hooks."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rlm_graph
from rlm_graph.hooks import HookSpecs

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rlm_graph"
PURE = [
    "graph", "protocol", "repl", "events", "report", "limits.py", "contracts.py", "errors.py",
    # the evaluation's data, scoring, statistics and pages (its runner uses the batch layer)
    "eval/items.py", "eval/scoring.py", "eval/stats.py", "eval/tasks", "eval/convert", "eval/table.py",
    "eval/page.py",
]
FORBIDDEN = {"trio", "httpx", "opentelemetry", "outcome"}


def test_public_api_is_sorted_and_importable() -> None:
    assert rlm_graph.__all__ == sorted(rlm_graph.__all__)
    for name in rlm_graph.__all__:
        assert getattr(rlm_graph, name) is not None


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
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
        paths = [PACKAGE / entry] if entry.endswith(".py") else sorted((PACKAGE / entry).rglob("*.py"))
        for path in paths:
            imported = _imports(path)
            bad = (imported & FORBIDDEN) | {
                m for m in imported if m.lstrip(".").split(".")[0] in ("runtime", "engine", "rlm", "tracing", "cli")
            }
            if bad:
                offenders.append(f"{path.relative_to(ROOT)}: {sorted(bad)}")
    assert not offenders, offenders


def test_only_the_runtime_and_facade_import_trio() -> None:
    allowed = ("runtime", "engine.py", "rlm.py", "cli", "testing", "tracing")
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
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_plugins_and_examples_use_only_the_public_api() -> None:
    """First-party plugins and the example third-party plugin import what any stranger's
    plugin may: never ``rlm_graph.runtime`` (private; `rlm_graph.http` is the door)."""
    files = sorted((ROOT / "plugins").rglob("*.py")) + sorted((ROOT / "examples").rglob("*.py"))
    assert len(files) > 10
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        for name in sorted(_imported_modules(path))
        if name == "rlm_graph.runtime" or name.startswith("rlm_graph.runtime.")
    ]
    assert not offenders, offenders


HEAVY = ("trio", "httpx", "opentelemetry", "networkx", "h11", "pluggy")


def _loaded_after(statement: str) -> list[str]:
    script = f"import sys; {statement}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [m for m in done.stdout.strip().split(",") if m]


def test_import_rlm_graph_is_cheap_and_names_load_on_use() -> None:
    """The public names load their modules on first use: ``import rlm_graph`` (and the
    pure ``rlm_graph.repl`` the subprocess guest needs) pulls in no engine libraries."""
    assert _loaded_after("import rlm_graph") == []
    assert _loaded_after("import rlm_graph.repl, rlm_graph.contracts, rlm_graph.errors") == []
    assert "trio" in _loaded_after("import rlm_graph; rlm_graph.RLM")
    assert set(dir(rlm_graph)) >= set(rlm_graph.__all__)
