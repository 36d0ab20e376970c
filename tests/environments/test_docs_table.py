"""docs/environments.md's table of what each environment stops points at real tests."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_the_table_names_exists() -> None:
    text = (ROOT / "docs" / "environments.md").read_text(encoding="utf-8")
    section = text.split("## What each environment stops", 1)[1].split("\n## ", 1)[0]
    named: list[tuple[str, str]] = []
    for row in (line for line in section.splitlines() if line.startswith("| ") and "::" in line):
        current = ""
        for path, name in re.findall(r"`(tests/[\w/]+\.py)?::(\w+)`", row):
            current = path or current
            named.append((current, name))
    assert len(named) >= 15
    for path, name in named:
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        functions = {
            n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        assert name in functions, f"docs/environments.md names {path}::{name}, which does not exist"
