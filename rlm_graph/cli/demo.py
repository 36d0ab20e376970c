"""``rlm-graph demo``: the offline demo (see `rlm_graph.demo`)."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

from .._files import destination_problem, write_private
from ..demo import QUESTION, build_document, demo_rlm_kwargs
from ..errors import ConfigError
from ..graph import NodeKind, counts_by_kind, makespan, peak_concurrency, to_json
from . import refuse
from .progress import add_progress_arguments, progress_for
from .report import add_report_argument, report_writers
from .trace import add_trace_argument, finish_tracing, tracer_provider_for


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="find a needle in a 2 MB document with a scripted RLM (offline)"
    )
    parser.add_argument("--size", type=int, default=2_000_000, help="document size in characters")
    parser.add_argument(
        "--latency", type=float, default=0.2, help="simulated seconds per model call"
    )
    parser.add_argument("--max-concurrent", type=int, default=16, help="provider concurrency limit")
    parser.add_argument("--seed", type=int, default=7, help="seed of the generated document")
    parser.add_argument(
        "--out", default="traces/demo-graph.json", help="where to write the run's graph (JSON)"
    )
    add_trace_argument(parser)
    add_progress_arguments(parser)
    add_report_argument(parser)
    parser.set_defaults(func=run)


_MIN_SIZE, _MAX_SIZE = 10_000, 500_000_000  # the document is built in memory, twice over


def _check(args: argparse.Namespace) -> None:
    """The demo's own options, and where its graph goes, before anything runs."""
    if not (
        _MIN_SIZE <= args.size <= _MAX_SIZE
        and 0 <= args.latency < math.inf
        and args.max_concurrent >= 1
    ):
        raise ConfigError(
            f"--size must be {_MIN_SIZE:,}-{_MAX_SIZE:,} characters, --latency a number of "
            "seconds >= 0, --max-concurrent >= 1"
        )
    problem = destination_problem(args.out)
    if problem is not None:
        raise ConfigError(f"--out: {problem}")


def run(args: argparse.Namespace) -> int:
    from ..rlm import RLM

    display = progress_for(args)
    try:
        _check(args)
        reports = report_writers(args, display.say, "rlm-graph demo")
        provider = tracer_provider_for(args)
        engine = RLM(
            **demo_rlm_kwargs(args.latency, args.max_concurrent),  # type: ignore[arg-type]
            tracer_provider=provider,
            trace_content=args.trace_content,
            record_content=args.trace_content,
            listeners=[*display.listeners(), *reports],
            observers=reports,  # they keep the graph of a run cut short
        )
    except ConfigError as exc:  # bad options, paths or OTEL_* settings: one line, as for run
        return refuse("demo", exc)
    setup = build_document(args.size, args.seed)
    print(
        f"Document: {len(setup.document):,} characters; the fact is hidden at offset {setup.position:,}."
    )
    print(f"Question: {QUESTION}\n")
    try:
        with display:
            result = engine.completion(setup.document, root_prompt=QUESTION)
    finally:
        finish_tracing(provider)
    graph = result.graph
    ok = result.response == setup.code
    print(f"Answer: {result.response}  ({'correct' if ok else 'WRONG, expected ' + setup.code})")
    print(f"Nodes: {', '.join(f'{n} {k}' for k, n in sorted(counts_by_kind(graph).items()))}")
    print(f"Peak sub-calls in flight: {peak_concurrency(graph, NodeKind.LLM_CALL)}")
    for model, usage in result.usage_summary.model_usage_summaries.items():
        print(
            f"Model {model}: {usage.total_calls} call{'' if usage.total_calls == 1 else 's'}, "
            f"{usage.total_input_tokens:,} input "
            f"and {usage.total_output_tokens:,} output tokens"
        )
    print(f"Makespan: {makespan(graph):.3f} s (wall clock {result.execution_time:.3f} s)")
    print(
        f"Critical path: {result.critical_path.length:.3f} s through {' -> '.join(result.critical_path.nodes)}"
    )
    print(f"Parallel efficiency: {result.parallel_efficiency:.1%} (critical path / makespan)")
    calls = len(list(graph.records(NodeKind.LLM_CALL)))
    serial = calls * args.latency
    print(
        f"The {calls} sub-calls would take {serial:.1f} s one after another, as in the RLM paper."
    )
    try:
        folder = os.path.dirname(args.out)
        if folder:
            os.makedirs(folder, exist_ok=True)
        write_private(args.out, to_json(graph, indent=1))
    except OSError as exc:  # a full disk: the file that was there is left as it was
        return refuse("demo", OSError(f"cannot write {args.out}: {exc.strerror or exc}"))
    print(
        f"Graph written to {args.out} (rlm-graph trace export, or load it with rlm_graph.graph.from_json)."
    )
    return 0 if ok else 1
