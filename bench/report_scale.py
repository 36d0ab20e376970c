"""How the HTML report scales: build, size and time to open in headless Chromium.

    .venv/bin/python bench/report_scale.py --nodes 1000 10000 20000

For each size: a synthetic run (root turns, each with a REPL block spawning 98 sub-calls,
times staggered so that up to ~6 sub-calls overlap), the time to build the page from the
graph, the file's size, and, in headless Chromium (``--dump-dom``, median of 3), the time
from navigation start to both views drawn as the page itself measures it
(``data-drawn-ms``), and the whole browser process (start-up and the DOM dump included).
Run by hand, never by the test suite; results go in docs/benchmarks.md.

    .venv/bin/python bench/report_scale.py --screenshot docs/images/report.png

writes the README's screenshot instead: a real depth-2 run with a failing sub-call, one
node selected.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlm_graph.graph import Graph, NodeKind, NodeRecord, NodeStatus
from rlm_graph.report import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"]


def synthetic(nodes: int) -> Graph:
    graph = Graph()
    t, previous, turn = 0.0, None, 0
    while len(graph) < nodes:
        turn += 1
        turn_id = f"turn-{turn}"
        graph.add(
            NodeRecord(
                id=turn_id,
                kind=NodeKind.ROOT_TURN,
                iteration=turn,
                status=NodeStatus.OK,
                start=t,
                end=t + 1.0,
                model="root",
            ),
            after=[previous] if previous else [],
        )
        block = f"{turn_id}/block-1"
        graph.add(
            NodeRecord(
                id=block,
                kind=NodeKind.REPL_BLOCK,
                iteration=turn,
                status=NodeStatus.OK,
                start=t + 1.0,
                end=t + 3.0,
            ),
            after=[turn_id],
        )
        for slot in range(min(98, nodes - len(graph))):
            graph.add(
                NodeRecord(
                    id=f"{block}/llm-1.{slot}",
                    kind=NodeKind.LLM_CALL,
                    depth=1,
                    status=NodeStatus.OK,
                    start=t + 1.0 + slot % 16 * 0.1,
                    end=t + 1.5 + slot % 16 * 0.1,
                    model="sub",
                    input_preview="x" * 200,
                    output_preview="y" * 200,
                ),
                parent=block,
            )
        t += 3.0
        previous = block
    return graph


def load_seconds(page: Path, profile: Path) -> tuple[float, float]:
    """(seconds from navigation start to both views drawn, as the page measures it;
    seconds of the whole chromium process, start-up and DOM dump included)."""
    started = time.perf_counter()
    done = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True,
        check=True,
        timeout=300,
        text=True,
    )
    whole = time.perf_counter() - started
    found = re.search(r'data-drawn-ms="(\d+)"', done.stdout)
    return (int(found.group(1)) / 1000 if found else float("nan")), whole


def measure(sizes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        empty = root / "empty.html"
        empty.write_text("<!DOCTYPE html><html><body></body></html>")
        base = statistics.median(load_seconds(empty, root / "p")[1] for _ in range(3))
        print(f"a chromium process opening an empty page: {base:.2f} s")
        print(
            "| nodes | build page (s) | file (MB) | navigation to drawn (s) | whole chromium process (s) |"
        )
        print("| ---: | ---: | ---: | ---: | ---: |")
        for size in sizes:
            graph = synthetic(size)
            started = time.perf_counter()
            page = write_report(graph, root / f"r{size}.html")
            build = time.perf_counter() - started
            runs = [load_seconds(page, root / "p") for _ in range(3)]
            drawn = statistics.median(r[0] for r in runs)
            whole = statistics.median(r[1] for r in runs)
            mb = page.stat().st_size / 1e6
            print(f"| {len(graph):,} | {build:.2f} | {mb:.1f} | {drawn:.2f} | {whole:.2f} |")


def screenshot(target: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.report.test_report import depth2_run  # the test suite's showcase run

    result = depth2_run()
    failed = next(r.id for r in result.graph.records() if r.status == NodeStatus.ERROR)
    with tempfile.TemporaryDirectory() as folder:
        page = write_report(
            result.graph, Path(folder) / "run.html", title="rlm-graph run: a depth-2 RLM"
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                CHROMIUM,
                *FLAGS,
                f"--user-data-dir={folder}/p",
                "--window-size=1400,820",
                f"--screenshot={target.resolve()}",
                page.as_uri() + f"#node={failed}",
            ],
            capture_output=True,
            check=True,
            timeout=120,
        )
    print(f"screenshot written to {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10_000, 20_000])
    parser.add_argument("--screenshot", type=Path, default=None)
    args = parser.parse_args()
    if args.screenshot:
        screenshot(args.screenshot)
    else:
        measure(args.nodes)


if __name__ == "__main__":
    main()
