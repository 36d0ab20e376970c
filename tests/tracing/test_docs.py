"""docs/tracing.md documents every span attribute and span name the code uses, and no other."""

from __future__ import annotations

import re
from pathlib import Path

from rlm_graph.tracing import SEMCONV_VERSION, SPAN_ATTRIBUTES, SPAN_NAMES

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "tracing.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    start = DOC.index(f"\n## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end != -1 else None]


def first_cells(text: str) -> list[str]:
    return re.findall(r"^\| `([^`]+)`", text, flags=re.MULTILINE)


def test_every_span_attribute_is_documented_and_every_documented_one_exists() -> None:
    documented = first_cells(section("Attributes"))
    assert len(documented) == len(set(documented)), "an attribute is documented twice"
    assert sorted(documented) == sorted(SPAN_ATTRIBUTES)


def test_every_span_name_is_documented() -> None:
    names = set(first_cells(section("Spans")))
    for pattern in {*SPAN_NAMES.values(), "invoke_workflow", "invoke_agent rlm"}:
        assert pattern in names, f"span name {pattern!r} missing from docs/tracing.md"


def test_the_pinned_semconv_version_is_the_documented_one() -> None:
    assert f"version {SEMCONV_VERSION}" in section("Conventions followed")


def test_the_traces_readme_says_how_to_start_jaeger_and_open_a_file() -> None:
    readme = (ROOT / "traces" / "README.md").read_text(encoding="utf-8")
    for needle in ("16686", "4318", "OTEL_EXPORTER_OTLP_ENDPOINT", "Upload JSON"):
        assert needle in readme
