"""What a ``subprocess`` guest costs to start, per isolation plan.

    .venv/bin/python bench/subprocess_start.py --reps 20

For each plan (the one this machine chooses: with a private /tmp and Landlock where the
kernel allows; the same plan without Landlock; the plan of before, namespaces and uid
65534 only; and "no isolation" for comparison), starts and closes ``--reps``
environments one after the other, each running one block, and prints the median and
the spread of start + first block + close, in milliseconds.
Run by hand, never by the test suite.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from typing import Any

import trio

from rlm_graph_subprocess import SubprocessEnvironment, isolation


async def one(network: bool) -> float:
    started = time.perf_counter()
    env = SubprocessEnvironment(bridge=Any, network=network)  # type: ignore[arg-type]
    try:
        await env.start()
        result = await env.execute("x = 1 + 1")
        assert result.error is None, result
    finally:
        await env.aclose()
    return (time.perf_counter() - started) * 1000


async def plan(name: str, chosen: isolation.Isolation | None, reps: int) -> None:
    if chosen is not None:
        isolation._chosen[True] = chosen
    got = await isolation.choose_isolation(True)
    await one(True)  # warm the page cache
    times = sorted([await one(True) for _ in range(reps)])
    print(
        f"{name:<14} {got.describe():<110} median {statistics.median(times):6.1f} ms  "
        f"min {times[0]:6.1f}  max {times[-1]:6.1f}  (n={reps})"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    chosen = await isolation.choose_isolation(True)
    await plan("chosen", None, args.reps)
    bare = copy.copy(chosen)
    bare.landlock = 0
    await plan("no Landlock", bare, args.reps)
    for candidate in isolation._plans(True, os.geteuid() == 0, 0):
        if candidate.pid_namespace and not candidate.private_tmp:
            if await isolation._try(candidate) is None:
                await plan("before", candidate, args.reps)
                break
    await plan("no isolation", isolation.Isolation(), args.reps)


if __name__ == "__main__":
    trio.run(main)
