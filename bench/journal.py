"""The journal's cost: the 10,000-sub-call overhead scenario with and without ``journal=``.

    .venv/bin/python bench/journal.py [--n 10000] [--reps 3] [--out /tmp/journal.jsonl]
    .venv/bin/python bench/journal.py --instructions [--n 10000]

For each engine mode (in-process ``direct`` provider; HTTP against the fake server with
the ``lean`` transport) it runs ``overhead-batched:N`` alternately without and with a
journal (a new file per run, so every node is written), ``--reps`` times each, each run
in a process of its own (`bench/ours.py`), then prints the medians: wall and CPU per
sub-call, the journal's bytes per node, and the replay of the journaled run (every node
answered from the journal, no request). Results go to docs/benchmarks.md by hand.

``--instructions`` counts machine instructions instead of seconds: each run goes under
valgrind (callgrind, counting only the timed completion, threads included), once
without and once with a journal. Instructions do not depend on what else the machine
runs, so this is the figure to trust on a shared machine; CPU seconds also pay for cache
misses, which instruction counts do not see.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import OURS_PYTHON, Server  # noqa: E402


def one(
    mode: str,
    n: int,
    out: str,
    base_url: str | None,
    journal: str | None,
    *,
    instructions: bool = False,
) -> int | None:
    """Run the scenario once in a process of its own; with ``instructions``, under
    callgrind, and return the instructions the completion took."""
    command = [
        OURS_PYTHON,
        str(HERE / "ours.py"),
        "--mode",
        "http" if mode == "lean" else mode,
        "--scenario",
        f"overhead-batched:{n}",
        "--out",
        out,
    ]
    if mode == "lean":
        command += ["--base-url", str(base_url), "--transport", "lean"]
    if journal is not None:
        command += ["--journal", journal]
    if not instructions:
        subprocess.run(command, check=True)
        return None
    valgrind = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--callgrind-out-file=/dev/null",
    ]
    done = subprocess.run(
        [*valgrind, *command, "--callgrind"], check=True, capture_output=True, text=True
    )
    found = re.search(r"Collected : ([\d,]+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def instruction_table(modes: list[str], n: int, base_url: str | None) -> str:
    lines = [
        "| engine | instructions / sub-call, no journal | with journal | journal's share |",
        "| --- | ---: | ---: | ---: |",
    ]
    folder = tempfile.mkdtemp(prefix="rlm-journal-bench-")
    out = tempfile.mktemp(suffix=".jsonl")
    for mode in modes:
        without = one(mode, n, out, base_url, None, instructions=True)
        with_ = one(mode, n, out, base_url, folder, instructions=True)
        assert without is not None and with_ is not None
        name = "direct" if mode == "direct" else "http/lean"
        lines.append(
            f"| {name} | {without / n / 1e3:.1f} k | {with_ / n / 1e3:.1f} k | +{(with_ - without) / without:.1%} |"
        )
    return "\n".join(lines)


def table(rows: list[dict[str, Any]], n: int) -> str:
    lines = [
        "| engine | journal | wall / sub-call | CPU / sub-call | journal bytes / node | replay: wall / node | replay: CPU / node |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for mode in ("direct", "http/lean"):
        for journaled in (False, True):
            picked = [r for r in rows if r["mode"] == mode and bool(r.get("journal")) == journaled]
            if not picked:
                continue
            assert all(r["correct"] for r in picked), "a run answered wrong"
            wall = statistics.median(r["wall"] for r in picked) / n * 1e3
            cpu = statistics.median(r["cpu"] for r in picked) / n * 1e3
            cells = [mode, "yes" if journaled else "no", f"{wall:.3f} ms", f"{cpu:.3f} ms"]
            if journaled:
                assert all(r["replay_correct"] and not r["replay_requests"] for r in picked)
                size = statistics.median(r["journal_bytes"] / r["journal_nodes"] for r in picked)
                rwall = (
                    statistics.median(r["replay_wall"] / r["journal_nodes"] for r in picked) * 1e3
                )
                rcpu = statistics.median(r["replay_cpu"] / r["journal_nodes"] for r in picked) * 1e3
                cells += [f"{size:.0f} B", f"{rwall:.3f} ms", f"{rcpu:.3f} ms"]
            else:
                cells += ["", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--modes", default="direct,lean")
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions under valgrind"
    )
    args = parser.parse_args()
    if args.instructions:
        with Server() as server:
            print(instruction_table(args.modes.split(","), args.n, server.base_url))
        return
    out = args.out or tempfile.mktemp(suffix=".jsonl")
    folder = tempfile.mkdtemp(prefix="rlm-journal-bench-")
    with Server() as server:
        for _ in range(args.reps):
            for mode in args.modes.split(","):
                one(mode, args.n, out, server.base_url, None)
                one(mode, args.n, out, server.base_url, folder)
    rows = [json.loads(line) for line in Path(out).read_text().splitlines()]
    print(table(rows, args.n))
    print(f"\nrows: {out}; journals: {folder} ({len(os.listdir(folder))} files)")


if __name__ == "__main__":
    main()
