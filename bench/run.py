"""Run the RLM benchmarks: rlm-graph and the reference library, same scenarios, same server.

    .venv/bin/python bench/run.py --scenario all --engine both

What it does:
    1. (``--engine reference|both``) makes the reference library's own venv,
       ``bench/.venv-rlms`` (``python3.11 -m venv`` + ``pip install rlms``), if missing;
    2. starts the fake OpenAI server (`bench/fake_server.py`) in a process of its own on
       127.0.0.1; it stops when this script ends;
    3. runs each engine in a subprocess of its own, one after the other, never two at
       once: ours in-process (``scripted``, ``direct`` providers) and over HTTP (the
       ``openai`` backend with ``--transports``), the reference over HTTP;
    4. checks every answer, and writes every run to ``bench/results/<stamp>.jsonl`` and
       the tables to ``bench/results/<stamp>.md`` (and stdout).

Scenarios (``--scenario``, comma-separated): ``timed`` (fanout, chain, depth2,
multibatch), ``overhead``, ``first``, ``memory``, or ``all``; see bench/scenarios.py.
Run by hand, never by the test suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import scenarios  # noqa: E402 - from this folder, on the path above

OURS_PYTHON = sys.executable
REF_VENV = HERE / ".venv-rlms"
REF_PYTHON = REF_VENV / "bin" / "python"
RESULTS = HERE / "results"

OVERHEAD = ("overhead-batched:0", "overhead-batched:1000", "overhead-sequential:1000")
FIRST_REPS = 6  # rep 0 is the process's first completion (cold), 1.. are warm
SUBPROCESS_TIMEOUT = 600


def ensure_reference_venv() -> None:
    if REF_PYTHON.exists():
        return
    print(f"creating {REF_VENV} (python3.11 -m venv; pip install rlms) ...", flush=True)
    subprocess.run(["python3.11", "-m", "venv", str(REF_VENV)], check=True)
    subprocess.run([str(REF_VENV / "bin" / "pip"), "install", "-q", "rlms"], check=True)


class Server:
    """The fake server subprocess; stops when its stdin closes."""

    def __enter__(self) -> Server:
        self.proc = subprocess.Popen(
            [OURS_PYTHON, str(HERE / "fake_server.py"), "--max-seconds", "3600"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url.startswith("http://127.0.0.1:"):
            raise SystemExit(f"fake server did not start: {self.base_url!r}")
        return self

    def stats(self) -> dict[str, Any]:
        root = self.base_url.rsplit("/v1", 1)[0]
        with urllib.request.urlopen(f"{root}/stats", timeout=10) as response:
            return json.loads(response.read())

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def drive(command: list[str], out: Path) -> list[dict[str, Any]]:
    """Run one driver subprocess; return the rows it wrote."""
    if out.exists():
        out.unlink()
    started = time.perf_counter()
    done = subprocess.run([*command, "--out", str(out)], timeout=SUBPROCESS_TIMEOUT, check=False)
    took = time.perf_counter() - started
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    label = " ".join(Path(c).name if "/" in c else c for c in command[1:6])
    print(f"  {label} ...: {len(rows)} runs in {took:.1f} s (exit {done.returncode})", flush=True)
    return rows


def scenario_args(keys: list[str], reps: int) -> list[str]:
    args = []
    for key in keys:
        args += ["--scenario", key]
    return [*args, "--reps", str(reps)]


def plan(
    groups: set[str],
    engines: set[str],
    transports: list[str],
    reps: int,
    memory_n: list[int],
    memory_http_n: int,
    provider_limit: str = "64",
) -> list[tuple[str, list[str]]]:
    """(name, command) of every driver process to run, in order."""
    jobs: list[tuple[str, list[str]]] = []
    ours = [OURS_PYTHON, str(HERE / "ours.py")]
    ref = [str(REF_PYTHON), str(HERE / "reference_driver.py")]

    def batches(timed: bool, overhead: bool) -> list[list[str]]:
        out = []
        if "first" in groups:
            out.append(scenario_args(["first"], FIRST_REPS))
        if timed and "timed" in groups:
            out.append(scenario_args(list(scenarios.TIMED), reps))
        if overhead and "overhead" in groups:
            out.append(scenario_args(list(OVERHEAD), reps))
        return out

    if "ours" in engines:
        for mode, timed in (("scripted", True), ("direct", False)):
            for args in batches(timed, True):
                jobs.append((f"ours-{mode}", [*ours, "--mode", mode, *args]))
        for transport in transports:
            for args in batches(True, True):
                jobs.append(
                    (
                        f"ours-http-{transport}",
                        [
                            *ours,
                            "--mode",
                            "http",
                            "--transport",
                            transport,
                            "--provider-limit",
                            provider_limit,
                            "{base_url}",
                            *args,
                        ],
                    )
                )
        if "memory" in groups:
            for n in memory_n:
                jobs.append(
                    (
                        "ours-memory",
                        [
                            *ours,
                            "--mode",
                            "direct",
                            "--memory",
                            *scenario_args([f"overhead-batched:{n}"], 1),
                        ],
                    )
                )
            for transport in transports:
                jobs.append(
                    (
                        f"ours-memory-http-{transport}",
                        [
                            *ours,
                            "--mode",
                            "http",
                            "--transport",
                            transport,
                            "{base_url}",
                            "--memory",
                            *scenario_args([f"overhead-batched:{memory_http_n}"], 1),
                        ],
                    )
                )
    if "reference" in engines:
        for args in batches(True, True):
            jobs.append(("reference", [*ref, "{base_url}", *args]))
        if "memory" in groups:
            jobs.append(
                (
                    "reference-memory",
                    [
                        *ref,
                        "{base_url}",
                        "--memory",
                        *scenario_args([f"overhead-batched:{memory_http_n}"], 1),
                    ],
                )
            )
    return jobs


# -- tables ---------------------------------------------------------------------------


def label(row: dict[str, Any]) -> str:
    return "reference (HTTP)" if row["engine"] == "reference" else f"ours {row['mode']}"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def timed_table(rows: list[dict[str, Any]]) -> str:
    cells: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    columns: list[str] = []
    for row in rows:
        if row["scenario"] in scenarios.TIMED and "mem_peak" not in row:
            cells[(row["scenario"], label(row))].append(row)
            if label(row) not in columns:
                columns.append(label(row))
    lines = [
        "| scenario | ideal | " + " | ".join(columns) + " |",
        "| --- | --- | " + " | ".join("---" for _ in columns) + " |",
    ]
    for key in scenarios.TIMED:
        ideal = scenarios.get(key).ideal or 0.0
        out = [key, f"{ideal:.3f} s"]
        for column in columns:
            runs = cells.get((key, column), [])
            if not runs:
                out.append("–")
                continue
            ok = sum(1 for r in runs if r["correct"])
            good = [r["wall"] for r in runs if r["correct"]]
            if not good:
                out.append(f"**wrong answer** {ok}/{len(runs)}")
                continue
            wall = median(good)
            out.append(f"{wall:.3f} s (+{100 * (wall / ideal - 1):.1f}%) {ok}/{len(runs)} ok")
        lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines)


def graph_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | mode | wall | graph makespan | graph critical path | parallel efficiency | peak llm_calls |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    seen: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["engine"] == "ours" and row["scenario"] in scenarios.TIMED:
            seen[(row["scenario"], row["mode"])].append(row)
    for (key, mode), runs in seen.items():
        lines.append(
            f"| {key} | {mode} | {median([r['wall'] for r in runs]):.3f} s "
            f"| {median([r['makespan'] for r in runs]):.3f} s "
            f"| {median([r['critical_path'] for r in runs]):.3f} s "
            f"| {median([r['parallel_efficiency'] for r in runs]):.3f} "
            f"| {max(r['peak_llm_calls'] for r in runs)} |"
        )
    return "\n".join(lines)


def overhead_table(rows: list[dict[str, Any]]) -> str:
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    order: list[str] = []
    for row in rows:
        if row["scenario"] in OVERHEAD and "mem_peak" not in row:
            by[(label(row), row["scenario"])].append(row)
            if label(row) not in order:
                order.append(label(row))
    lines = [
        "| engine | empty completion | batched 1000: wall per sub-call | batched: CPU per sub-call "
        "| sequential 1000: wall per call | sequential: CPU per call | answers |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in order:
        base = by.get((name, OVERHEAD[0]), [])
        b_wall, b_cpu = median([r["wall"] for r in base]), median([r["cpu"] for r in base])
        cells = [name, f"{1000 * b_wall:.1f} ms"]
        answers = []
        for key in OVERHEAD[1:]:
            runs = by.get((name, key), [])
            n = scenarios.get(key).sub_calls
            answers.append(f"{sum(r['correct'] for r in runs)}/{len(runs)}")
            wall = (median([r["wall"] for r in runs]) - b_wall) / n
            cpu = (median([r["cpu"] for r in runs]) - b_cpu) / n
            cells += [f"{1000 * wall:.3f} ms", f"{1000 * cpu:.3f} ms"]
        cells.append(" + ".join(answers))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def first_table(rows: list[dict[str, Any]], arrivals: dict[str, float]) -> str:
    by: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        if row["scenario"] != "first":
            continue
        if row.get("first_in_process") is not None:
            at = row["first_in_process"]
        elif row["run_id"] in arrivals:
            at = arrivals[row["run_id"]] - row["t0"]
        else:
            continue
        by[label(row)].append((row["rep"], at))
    lines = [
        "| engine | first request, cold (first completion in the process) | warm (median of 5) | answers |",
        "| --- | --- | --- | --- |",
    ]
    for name, values in by.items():
        cold = [v for rep, v in values if rep == 0]
        warm = [v for rep, v in values if rep > 0]
        ok = sum(1 for r in rows if r["scenario"] == "first" and label(r) == name and r["correct"])
        lines.append(
            f"| {name} | {1000 * cold[0]:.1f} ms | {1000 * median(warm):.1f} ms | {ok}/{len(values)} |"
        )
    return "\n".join(lines)


def memory_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| engine | sub-calls | nodes | peak (tracemalloc) | prompts + answers | peak per node beyond them "
        "| retained after (result alive) per node | answer |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    mem = [r for r in rows if "mem_peak" in r]
    for row in mem:
        n = scenarios.get(row["scenario"]).sub_calls
        nodes = row.get("nodes") or n
        payload = row.get("payload") or sum(
            sys.getsizeof(f"sq {i}") + sys.getsizeof(str(i * i)) for i in range(n)
        )
        lines.append(
            f"| {label(row)} | {n:,} | {nodes:,}{'' if row.get('nodes') else ' (sub-calls)'} "
            f"| {row['mem_peak'] / 1e6:.1f} MB | {payload / 1e6:.2f} MB "
            f"| {(row['mem_peak'] - payload) / nodes / 1024:.2f} KB "
            f"| {row['mem_retained'] / nodes / 1024:.2f} KB | {'ok' if row['correct'] else 'WRONG'} |"
        )
    ours = [r for r in mem if r["engine"] == "ours" and r["mode"] == "direct"]
    if len(ours) >= 2:
        xs = [float(r["nodes"]) for r in ours]
        ys = [float(r["mem_peak"]) for r in ours]
        slope, intercept = statistics.linear_regression(xs, ys)
        fit = max(abs(y - (slope * x + intercept)) / y for x, y in zip(xs, ys, strict=True))
        lines.append("")
        lines.append(
            f"Linear fit of ours (direct) peak over nodes: {slope / 1024:.2f} KB per node "
            f"+ {intercept / 1e6:.2f} MB, worst residual {100 * fit:.1f}%."
        )
    return "\n".join(lines)


def errors(rows: list[dict[str, Any]]) -> str:
    bad = [r for r in rows if not r["correct"]]
    if not bad:
        return "Every answer checked correct."
    lines = ["Wrong answers:"]
    for r in bad:
        lines.append(
            f"- {label(r)} {r['scenario']} rep {r['rep']}: got {r['response'][:80]!r}, "
            f"expected {r['expected']!r} ({r.get('error')})"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--scenario", default="all", help="all, or a comma list of timed,overhead,first,memory"
    )
    parser.add_argument("--engine", choices=("ours", "reference", "both"), default="both")
    parser.add_argument(
        "--reps", type=int, default=3, help="runs per timed/overhead scenario (median)"
    )
    parser.add_argument("--transports", default="httpx,lean", help="our HTTP transports to run")
    parser.add_argument(
        "--provider-limit",
        default="64",
        help="our openai backend's max_concurrent (default 64, so it does not bind); "
        "'default' for none: the adaptive limit",
    )
    parser.add_argument(
        "--memory-n", default="2500,5000,10000", help="sub-calls for our in-process memory runs"
    )
    parser.add_argument(
        "--memory-http-n", type=int, default=2000, help="sub-calls for the HTTP memory runs"
    )
    args = parser.parse_args()
    groups = (
        {"timed", "overhead", "first", "memory"}
        if args.scenario == "all"
        else set(args.scenario.split(","))
    )
    engines = {"ours", "reference"} if args.engine == "both" else {args.engine}
    if "reference" in engines:
        ensure_reference_venv()
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with Server() as server:
        print(f"fake server {server.base_url} (own process)", flush=True)
        jobs = plan(
            groups,
            engines,
            args.transports.split(","),
            args.reps,
            [int(n) for n in args.memory_n.split(",")],
            args.memory_http_n,
            args.provider_limit,
        )
        for i, (name, command) in enumerate(jobs):
            command = [
                c
                for part in command
                for c in (["--base-url", server.base_url] if part == "{base_url}" else [part])
            ]
            rows += drive(command, RESULTS / f"{stamp}-{i}-{name}.jsonl")
        arrivals = server.stats()["first_arrival"]
    took = time.perf_counter() - started
    versions = {r.get("version") for r in rows if r["engine"] == "reference"} - {None}
    report = "\n\n".join(
        [
            f"Run {stamp}, {took:.0f} s; reference rlms {', '.join(sorted(versions)) or '-'}.",
            "Timed scenarios: median wall clock of completion() (ideal = model latency on the critical path):",
            timed_table(rows),
            "Ours, from the graph (median):",
            graph_table(rows),
            "Engine overhead at zero latency, marginal cost over an empty completion (median):",
            overhead_table(rows),
            "First request (completion() called -> first request at the model):",
            first_table(rows, arrivals),
            "Memory (tracemalloc, one run each):",
            memory_table(rows),
            errors(rows),
        ]
    )
    with open(RESULTS / f"{stamp}.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    (RESULTS / f"{stamp}.md").write_text(report + "\n")
    print("\n" + report)
    print(f"\nwritten: {RESULTS / (stamp + '.md')} and .jsonl")


if __name__ == "__main__":
    main()
