"""What watching a run costs: one completion with N zero-latency sub-calls, run plainly,
with a do-nothing listener, with the CLI's progress display (plain mode, to /dev/null),
and through ``rlm.stream()`` read as fast as it comes.

    .venv/bin/python bench/events_overhead.py --calls 2000 --repeat 5

Prints the median wall-clock seconds of each (a fresh RLM per run). Run by hand, never by
the test suite; results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from rlm_graph import RLM
from rlm_graph.cli.progress import ProgressDisplay
from rlm_graph.contracts import ChatRequest


def make(calls: int, listeners: list[Any]) -> RLM:
    code = f"r = llm_query_batched([str(i) for i in range({calls})])\nFINAL(str(len(r)))"

    def respond(request: ChatRequest) -> str:
        if any(m.role == "system" for m in request.messages):
            return f"```repl\n{code}\n```"
        return "ok"

    return RLM("scripted", {"respond": respond}, batch_max_concurrent=64, listeners=listeners)


def timed(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = args.calls
    with open(os.devnull, "w") as null:
        cases: dict[str, Callable[[], Any]] = {
            "no listener": lambda: make(n, []).completion("ctx"),
            "a listener that does nothing": lambda: make(n, [lambda e: None]).completion("ctx"),
            "progress display (plain, to /dev/null)": lambda: make(
                n, [ProgressDisplay("plain", verbose=True, stream=null)]
            ).completion("ctx"),
            "rlm.stream(), read at once": lambda: list(make(n, []).stream("ctx")),
        }
        print(f"| {n:,} sub-calls | median s of {args.repeat} |")
        print("| --- | ---: |")
        for name, fn in cases.items():
            print(f"| {name} | {timed(fn, args.repeat):.3f} |")


if __name__ == "__main__":
    main()
