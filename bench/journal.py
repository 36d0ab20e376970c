"""The journal's cost: the 10,000-sub-call overhead scenario with and without ``journal=``.

    .venv/bin/python bench/journal.py [--n 10000] [--reps 3] [--out /tmp/journal.jsonl]

For each engine mode (in-process ``direct`` provider; HTTP against the fake server with
the ``lean`` transport) it runs ``overhead-batched:N`` alternately without and with a
journal (a new file per run, so every node is written), ``--reps`` times each, each run
in a process of its own (`bench/ours.py`), then prints the medians: wall and CPU per
sub-call, the journal's bytes per node, and the replay of the journaled run (every node
answered from the journal, no request). Results go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import OURS_PYTHON, Server  # noqa: E402


def one(mode: str, n: int, out: str, base_url: str | None, journal: str | None) -> None:
    command = [OURS_PYTHON, str(HERE / "ours.py"), "--mode", "http" if mode == "lean" else mode,
               "--scenario", f"overhead-batched:{n}", "--out", out]
    if mode == "lean":
        command += ["--base-url", str(base_url), "--transport", "lean"]
    if journal is not None:
        command += ["--journal", journal]
    subprocess.run(command, check=True)


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
                rwall = statistics.median(r["replay_wall"] / r["journal_nodes"] for r in picked) * 1e3
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
    args = parser.parse_args()
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
