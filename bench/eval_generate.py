"""How long the generated evaluation tasks take to make: one item of each task at each
length, in a fresh process state (the filler pool is built once per process, and counted
in the first repetition only).

    .venv/bin/python bench/eval_generate.py --lengths 8k,128k,1m --repeat 5

Prints a Markdown table of the median seconds per item, and the characters made. Run by
hand, never by the test suite; results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

from rlm_graph.eval.tasks import TASKS, length_label, parse_lengths
from rlm_graph.eval.tasks.sniah import sniah_item
from rlm_graph.eval.tasks.synth import oolong_item, pairs_item

MAKERS = {"sniah": sniah_item, "synth-oolong": oolong_item, "synth-oolong-pairs": pairs_item}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="8k,128k,1m")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    lengths = parse_lengths(args.lengths)
    print(f"| task | length | characters | median s of {args.repeat} | first s |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name in args.tasks.split(","):
        make = MAKERS[name]
        for tokens in lengths:
            times, size = [], 0
            for index in range(args.repeat):
                started = time.perf_counter()
                item = make(index, tokens, 0)
                times.append(time.perf_counter() - started)
                size = len(item.context) if isinstance(item.context, str) else 0
            print(
                f"| {name} | {length_label(tokens)} | {size:,} | {statistics.median(times):.3f} | {times[0]:.3f} |"
            )


if __name__ == "__main__":
    main()
