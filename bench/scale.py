"""Benchmark: costs that must grow with a run's size, not faster. Offline (the scripted
provider, no latency), each scenario at a few sizes, so that a cost growing with the
square of the size shows as a time that quadruples when the size doubles:

    .venv/bin/python bench/scale.py

- ``batches B``: one block, two ``llm_query_batched`` of B prompts each (a map, then
  another): the run's time, its graph's edges and the process's peak memory.
- ``children K``: one ``rlm_query_batched`` of K children, with a journal; then the same
  completion again, every child replayed from the journal: live and replay times.
- ``trace S``: S spans of one trace through a `TraceFileExporter` (Jaeger and OTLP
  files) in the batches a file provider hands over (2,048): the export's time, and the
  spans the OTLP file holds.

Run by hand, never by the test suite; results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlm_graph import RLM  # noqa: E402


def batches(size: int) -> str:
    code = (
        f"a = llm_query_batched([f'item {{i}}' for i in range({size})])\n"
        f"b = llm_query_batched([f'item {{i}}' for i in range({size})])\n"
        "FINAL(str(len(a) + len(b)))"
    )
    root = f"```repl\n{code}\n```"

    def respond(request: object) -> str:
        last = request.messages[-1].content  # type: ignore[attr-defined]
        return "sub " + last if last.startswith("item ") else root

    rlm = RLM(backend="scripted", backend_kwargs={"model_name": "m", "respond": respond})
    start = time.perf_counter()
    result = rlm.completion("ctx", "go")
    took = time.perf_counter() - start
    assert result.response == str(2 * size), result.response
    edges = sum(1 for _ in result.graph.edges())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return f"{took:.2f} s, {edges:,} edges, peak {peak} MB"


def children(size: int) -> str:
    root = (
        f"```repl\nr = rlm_query_batched([f'child {{i}}' for i in range({size})])\n"
        "FINAL(str(len(r)))\n```"
    )
    child = "```repl\nFINAL(context.upper())\n```"

    def respond(request: object) -> str:
        messages = request.messages  # type: ignore[attr-defined]
        return root if any("QROOT" in m.content for m in messages[1:2]) else child

    with tempfile.TemporaryDirectory() as folder:
        journal = str(Path(folder) / "run.sqlite")
        times = []
        for _ in range(2):
            rlm = RLM(
                backend="scripted",
                backend_kwargs={"model_name": "m", "respond": respond},
                max_depth=2,
                journal=journal,
            )
            start = time.perf_counter()
            result = rlm.completion("ctx", "QROOT")
            times.append(time.perf_counter() - start)
            assert result.response == str(size), result.response
    assert result.replay is not None and result.replay.replayed >= size
    return f"live {times[0]:.2f} s, replay {times[1]:.2f} s"


def trace(size: int) -> str:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from rlm_graph.tracing import TraceFileExporter, load_trace

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    with tracer.start_as_current_span("root"):
        for i in range(size - 1):
            with tracer.start_as_current_span(f"llm_call {i}", attributes={"rlm.node_id": str(i)}):
                pass
    spans = list(memory.get_finished_spans())
    with tempfile.TemporaryDirectory() as folder:
        exporter = TraceFileExporter(folder, formats=("jaeger", "otlp"))
        start = time.perf_counter()
        for first in range(0, len(spans), 2048):
            exporter.export(spans[first : first + 2048])
        took = time.perf_counter() - start
        (otlp,) = Path(folder).glob("*.otlp.jsonl")
        kept = len(load_trace(otlp))
    return f"{took:.2f} s, {kept:,} spans in the file"


SCENARIOS = {"batches": batches, "children": children, "trace": trace}
SIZES = {
    "batches": [500, 1000, 2000],
    "children": [1000, 2000, 4000],
    "trace": [10000, 20000, 40000],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scenarios", nargs="*", help="batches, children, trace (default: all)")
    args = parser.parse_args()
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s) {sorted(unknown)}; choose from {list(SCENARIOS)}")
    print("| scenario | size | result |")
    print("| --- | ---: | --- |")
    for name in args.scenarios or SCENARIOS:
        for size in SIZES[name]:
            print(f"| {name} | {size:,} | {SCENARIOS[name](size)} |", flush=True)


if __name__ == "__main__":
    main()
