"""A trace as text: the span tree with durations, models, tokens and status, each span
with a bar on one shared time axis, so sub-calls that ran at once sit side by side.

Example (``rlm-graph trace show``)::

    trace 5b8aa5a2d2c872e8321cf37308d69df2 · 7 spans · 2.000 s · 330 tokens · 1 error
    span                          duration  model   tokens   status  0 s ─────── 2.000 s
    invoke_agent rlm                2.000s                   ok      ████████████████████
    ├─ chat m1 [turn-1]             0.500s  m1      100/20   ok      █████
    └─ execute_tool repl [block-1]  1.000s                   ok           ██████████
       ├─ chat m2 [llm-1]           1.000s  m2      10/5     ok           ██████████
       └─ chat m2 [llm-2]           0.500s  m2      10/5     error        ▒▒▒▒▒

Invariants: pure text, no terminal control codes; the width is the caller's choice. Each
column is at most `COLUMN_MAX` characters (a longer value is cut, ending in an ellipsis),
so a line is bounded whatever a file holds: at most the columns' total plus the bar.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .reader import TraceSpan, split_traces

__all__ = ["render_trace", "render_traces"]

LABEL_MAX = 56
# The widest each column is: span, duration, model, tokens, status (a file's model name
# of 200,000 characters padded every row to it: 400 MB printed for a 1 MB file).
COLUMN_MAX = (LABEL_MAX, 20, 32, 24, 32)


@dataclass(frozen=True)
class _Glyphs:
    fill: str
    fail: str
    tee: str
    last: str
    pipe: str
    rule: str
    more: str  # ends a value that was cut


UNICODE = _Glyphs("█", "▒", "├─ ", "└─ ", "│  ", "─", "…")
ASCII = _Glyphs("#", "x", "|- ", "`- ", "|  ", "-", "~")


def render_traces(
    spans: Sequence[TraceSpan], *, width: int = 120, timeline: bool = True, ascii: bool = False
) -> str:
    """Every trace of a file, one after the other (see `render_trace`)."""
    return "\n".join(
        render_trace(group, width=width, timeline=timeline, ascii=ascii)
        for group in split_traces(spans).values()
    )


def render_trace(
    spans: Sequence[TraceSpan], *, width: int = 120, timeline: bool = True, ascii: bool = False
) -> str:
    """One trace as a tree with a timeline.

    Args:
        spans: the spans of one trace.
        width: total line width; the timeline takes what the columns leave (at least 10).
        timeline: draw the bars.
        ascii: ASCII glyphs only (for terminals without box drawing).
    """
    glyphs = ASCII if ascii else UNICODE
    rows = list(_tree(spans, glyphs))
    if not rows:
        return "(no spans)\n"
    origin = min(span.start_us for span in spans)
    total = max(span.end_us for span in spans) - origin
    cells = [_cut(_cells(label, span), glyphs.more) for label, span in rows]
    header = ("span", "duration", "model", "tokens", "status")
    sizes = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
    used = sum(sizes) + 2 * len(sizes)
    bar_width = max(10, width - used) if timeline else 0
    lines = [_summary(spans, total, glyphs.more)]
    axis = _axis(total, bar_width, glyphs) if timeline else ""
    lines.append(_join(header, sizes, axis))
    for (_, span), row in zip(rows, cells, strict=True):
        bar = _bar(span, origin, total, bar_width, glyphs) if timeline else ""
        lines.append(_join(row, sizes, bar))
    return "\n".join(lines) + "\n"


def _cut(cells: Sequence[str], more: str) -> tuple[str, ...]:
    """``cells`` each at most its column's `COLUMN_MAX` characters."""
    return tuple(_short(cell, size, more) for cell, size in zip(cells, COLUMN_MAX, strict=True))


def _short(text: str, size: int, more: str) -> str:
    """``text``, or its start ending in ``more`` if it is longer than ``size``."""
    return text if len(text) <= size else text[: size - len(more)] + more


def _join(cells: Sequence[str], sizes: Sequence[int], tail: str) -> str:
    left, *rest = cells
    text = left.ljust(sizes[0]) + "  " + rest[0].rjust(sizes[1])
    for cell, size in zip(rest[1:], sizes[2:], strict=True):
        text += "  " + cell.ljust(size)
    return (text + "  " + tail).rstrip()


def _tree(spans: Sequence[TraceSpan], glyphs: _Glyphs) -> list[tuple[str, TraceSpan]]:
    ids = {span.span_id for span in spans}
    children: dict[str | None, list[TraceSpan]] = {}
    for span in spans:
        parent = span.parent_id if span.parent_id in ids else None
        children.setdefault(parent, []).append(span)
    rows: list[tuple[str, TraceSpan]] = []

    def walk(parent: str | None, prefix: str) -> None:
        kids = sorted(children.get(parent, []), key=lambda s: (s.start_us, s.span_id))
        for index, span in enumerate(kids):
            last = index == len(kids) - 1
            branch = "" if parent is None else (glyphs.last if last else glyphs.tee)
            rows.append((prefix + branch + _name(span), span))
            deeper = "" if parent is None else ("   " if last else glyphs.pipe)
            walk(span.span_id, prefix + deeper)

    walk(None, "")
    return rows


def _name(span: TraceSpan) -> str:
    node = span.node_id
    label = f"{span.name} [{node}]" if node and node not in span.name else span.name
    return label


def _cells(label: str, span: TraceSpan) -> tuple[str, str, str, str, str]:
    attrs = span.attributes
    model = str(attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model") or "")
    tokens = ""
    if "gen_ai.usage.input_tokens" in attrs or "gen_ai.usage.output_tokens" in attrs:
        tokens = (
            f"{attrs.get('gen_ai.usage.input_tokens', 0)}/"
            f"{attrs.get('gen_ai.usage.output_tokens', 0)}"
        )
    return label, f"{span.duration_us / 1e6:.3f}s", model, tokens, _status(span)


def _status(span: TraceSpan) -> str:
    if span.status == "error":
        kind = span.attributes.get("error.type")
        return f"error ({kind})" if kind else "error"
    return str(span.attributes.get("rlm.node.status") or "ok")


def _digits(count: int) -> str:
    """``count`` written out, or its size where it has more digits than Python writes (a
    hostile file's counts of 4,300 digits each, added up)."""
    try:
        return str(count)
    except ValueError:
        return f"~10^{int(count.bit_length() * math.log10(2))}"


def _summary(spans: Sequence[TraceSpan], total_us: int, more: str) -> str:
    tokens = sum(
        int(s.attributes.get("gen_ai.usage.input_tokens", 0))
        + int(s.attributes.get("gen_ai.usage.output_tokens", 0))
        for s in spans
    )
    errors = sum(span.status == "error" for span in spans)
    parts = [
        f"trace {_short(spans[0].trace_id, 32, more)}",  # base64 ids decode to any length
        f"{len(spans)} spans",
        f"{total_us / 1e6:.3f} s",
        f"{_short(_digits(tokens), COLUMN_MAX[3], more)} tokens",
    ]
    if errors:
        parts.append(f"{errors} error{'s' if errors > 1 else ''}")
    return " · ".join(parts)


def _axis(total_us: int, width: int, glyphs: _Glyphs) -> str:
    left, right = "0 s ", f" {total_us / 1e6:.3f} s"
    if width <= len(left) + len(right):
        return right.strip()
    return left + glyphs.rule * (width - len(left) - len(right)) + right


def _bar(span: TraceSpan, origin: int, total: int, width: int, glyphs: _Glyphs) -> str:
    if total <= 0:
        begin, end = 0, width
    else:
        begin = min(width - 1, round((span.start_us - origin) * width / total))
        end = max(begin + 1, round((span.end_us - origin) * width / total))
    fill = glyphs.fail if span.status == "error" else glyphs.fill
    return " " * begin + fill * (min(end, width) - begin)
