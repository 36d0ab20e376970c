"""Run the reference library (PyPI ``rlms``) on the bench scenarios.

Run by `bench/run.py` with the reference's own interpreter
(``bench/.venv-rlms/bin/python bench/reference_driver.py ...``), never imported by our
code. It talks to the same fake server (`bench/fake_server.py`) as our engine and writes
one JSON object per run to ``--out``, the same fields as `bench/ours.py`:

    engine, mode, scenario, rep, wall, cpu, t0, response, expected, correct, ...

``t0`` is CLOCK_MONOTONIC just before ``completion()`` is called; the server stamps the
first request of a run on the same clock, which gives the first-request latency.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scenarios
from rlm import RLM


def make_rlm(key: str, base_url: str) -> RLM:
    scenario = scenarios.get(key)
    return RLM(
        backend="openai",
        backend_kwargs={
            "model_name": key,
            "base_url": base_url,
            "api_key": "bench-not-a-key",
            "max_retries": 0,
        },
        environment="local",
        max_depth=scenario.max_depth,
        max_iterations=int(scenario.extra.get("max_iterations", 5)),
        max_concurrent_subcalls=4,
    )


def run_once(key: str, base_url: str, rep: int, memory: bool = False) -> dict[str, object]:
    scenario = scenarios.get(key)
    rlm = make_rlm(key, base_url)
    run_id = f"ref-{key.replace(':', '_')}-{rep}-{os.getpid()}"
    mem: dict[str, object] = {}
    if memory:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
    t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    error = None
    try:
        result = rlm.completion(
            "bench context", root_prompt=f"{scenarios.marker(run_id)} Compute the total."
        )
        response = result if isinstance(result, str) else result.response
    except Exception as exc:  # noqa: BLE001 - a reference failure is a table row, not a crash
        response, error = "", f"{type(exc).__name__}: {exc}"[:300]
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if memory:
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        mem = {"mem_peak": peak - base, "mem_retained": current - base}
    return {
        "engine": "reference",
        "mode": "http",
        "scenario": key,
        "rep": rep,
        "run_id": run_id,
        "t0": t0,
        "wall": wall,
        "cpu": cpu,
        "response": str(response)[:200],
        "expected": scenario.expected,
        "correct": str(response).strip() == scenario.expected,
        "error": error,
        **mem,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--scenario", action="append", required=True)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--memory", action="store_true", help="trace memory (tracemalloc)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import importlib.metadata

    version = importlib.metadata.version("rlms")
    with open(args.out, "a") as out:
        for key in args.scenario:
            for rep in range(args.reps):
                row = run_once(key, args.base_url, rep, memory=args.memory)
                row["version"] = version
                out.write(json.dumps(row) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
