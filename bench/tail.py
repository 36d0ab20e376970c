"""The tail and the limit: hedged sub-calls and the adaptive concurrency limit, measured.

    .venv/bin/python bench/tail.py --part all --reps 3

Each run starts a fake OpenAI-compatible server (`rlm_graph.testing.FakeOpenAIServer`)
in a process of its own on 127.0.0.1 and runs one completion against it over HTTP with
the ``openai`` backend; every answer is checked. Parts (``--part``, comma-separated):

    hedge      3 rounds of a 64-wide ``llm_query_batched`` (``batch_max_concurrent=64``)
               against a server whose every answer waits a seeded lognormal latency
               (median 1 s, p99 10 s): makespan and requests with hedging off and on.
    tight      8 rounds of a 64-wide batch (default ``batch_max_concurrent``, 16) against
               a server that refuses (429, ``Retry-After: 0``) past 6 requests in flight,
               0.2 s per answer: the adaptive limit (the default) against fixed limits.
    roomy      a recursive run, root ``rlm_query_batched`` of 8 children (4 in flight), each
               an ``llm_query_batched`` of 8, against a server with no limit (root and
               child turns 0.1 s, sub-calls 0.2 s): defaults against the old fixed 16;
               and the fan-out shapes (64 in one batch; 16 x 3 rounds) likewise.
    queue      6 rounds of 8 sub-calls, then one batch of 1,200 (as wide as it goes),
               against a server that serves 8 at a time, 50 ms each, and queues the rest
               without refusing (a local vLLM or llama.cpp with fixed slots), under a 3 s
               request timeout: the adaptive limit against fixed ones.

Prints one JSON line per run and a table per part. Run by hand, never by the tests.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rlm_graph import RLM
from rlm_graph.testing import FakeOpenAIServer, Lognormal, Reply, last_user_message

MARK = "[bench root]"


# -- the server, in a process of its own ---------------------------------------------


def _is_root(body: dict[str, Any]) -> bool:
    return any(MARK in str(m.get("content")) for m in body["messages"])


def _is_child(body: dict[str, Any]) -> bool:
    return not _is_root(body) and any(m.get("role") == "system" for m in body["messages"])


class Script:
    """What the server answers: the root's code, a child's code, a sub-call's echo; with
    per-role delays (0: the server's own latency)."""

    def __init__(self, root: str, child: str = "", turn: float = 0.0, sub: float = 0.0) -> None:
        self.root, self.child, self.turn, self.sub = root, child, turn, sub

    def __call__(self, body: dict[str, Any]) -> Any:
        if _is_root(body):
            return Reply(body=f"```repl\n{self.root}\n```", delay=self.turn)
        if _is_child(body):
            return Reply(body=f"```repl\n{self.child}\n```", delay=self.turn)
        return Reply(body="echo: " + last_user_message(body), delay=self.sub)


class Slots(Script):
    """A server with ``slots`` places: a sub-call holds one for ``sub`` seconds, the rest
    wait their turn (no refusal)."""

    def __init__(self, root: str, slots: int, sub: float) -> None:
        super().__init__(root)
        self.places, self.hold = threading.Semaphore(slots), sub

    def __call__(self, body: dict[str, Any]) -> Any:
        if _is_root(body):
            return super().__call__(body)
        with self.places:
            time.sleep(self.hold)
        return "echo: " + last_user_message(body)


def _serve(config: dict[str, Any], port: Any, counts: Any, stop: Any) -> None:
    latency: Any = config.get("latency", 0.0)
    if isinstance(latency, dict):
        latency = Lognormal(**latency)
    script: Script = Script(config["root"], config.get("child", ""), config["turn"], config["sub"])
    if config.get("slots"):
        script = Slots(config["root"], config["slots"], config["sub"])
    with FakeOpenAIServer(
        script, latency=latency, max_in_flight=config.get("max_in_flight")
    ) as server:
        counts["base_url"] = server.base_url
        port.value = 1
        stop.wait()
        counts["requests"] = len(server.requests)
        counts["refused"] = server.refused
        counts["cancelled"] = server.cancelled
        counts["peak"] = server.peak_in_flight
        counts["prompts"] = [last_user_message(r.body) for r in server.requests]


class Server:
    def __init__(self, config: dict[str, Any]) -> None:
        self.manager = multiprocessing.Manager()
        self.counts = self.manager.dict()
        self.port = multiprocessing.Value("i", 0)
        self.stop = multiprocessing.Event()
        self.process = multiprocessing.Process(
            target=_serve, args=(config, self.port, self.counts, self.stop), daemon=True
        )

    def __enter__(self) -> Server:
        self.process.start()
        while not self.port.value:
            time.sleep(0.01)
        self.base_url = str(self.counts["base_url"])
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.process.join(30)
        self.facts = dict(self.counts)
        self.manager.shutdown()


# -- the runs ----------------------------------------------------------------------


def _rounds(rounds: int, width: int) -> str:
    return (
        "good = 0\n"
        f"for r in range({rounds}):\n"
        f"    got = llm_query_batched([f'{{r}}-{{i}}' for i in range({width})])\n"
        f"    good += sum(a == f'echo: {{r}}-{{i}}' for i, a in enumerate(got))\n"
        "answer['content'] = str(good)\nanswer['ready'] = True"
    )


RECURSIVE_ROOT = (
    "parts = rlm_query_batched([f'part {k}' for k in range(8)])\n"
    "answer['content'] = str(sum(int(p) for p in parts))\nanswer['ready'] = True"
)
RECURSIVE_CHILD = (
    "k = int(context.split()[1])\n"
    "got = llm_query_batched([f'{k}-{i}' for i in range(8)])\n"
    "answer['content'] = str(sum(a == f'echo: {k}-{i}' for i, a in enumerate(got)))\n"
    "answer['ready'] = True"
)


def run_once(
    config: dict[str, Any], rlm_kwargs: dict[str, Any], backend: dict[str, Any]
) -> dict[str, Any]:
    with Server(config) as server:
        kwargs = {
            "model_name": "bench",
            "base_url": server.base_url,
            "api_key": "bench-not-a-key",
            "timeout": 60.0,
            "http_transport": "lean",
            **backend,
        }
        limits: list[int] = []

        def listen(event: Any) -> None:
            if getattr(event, "type", "") == "concurrency_limit":
                limits.append(event.limit)

        rlm = RLM("openai", kwargs, listeners=[listen], **rlm_kwargs)
        cpu, start = time.process_time(), time.perf_counter()
        result = rlm.completion("ctx", root_prompt=f"go {MARK}")
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    facts = server.facts
    hedged = [r for r in result.graph.records() if r.hedge is not None]
    return {
        "wall": wall,
        "engine_cpu": cpu,
        "response": result.response,
        "stop_reason": result.stop_reason,
        "requests": facts["requests"],
        "refused": facts["refused"],
        "cancelled": facts["cancelled"],
        "peak_in_flight": facts["peak"],
        "prompts": facts["prompts"],
        "hedged": len(hedged),
        "hedges_won": sum(r.hedge == "won" for r in hedged),
        "limit_end": limits[-1] if limits else None,
        "cost_tokens": result.usage_summary.to_dict(),
    }


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)


def part_hedge(reps: int, seed: int) -> list[str]:
    rounds, width = 3, 64
    config = {
        "root": _rounds(rounds, width),
        "turn": 0.0,
        "sub": 0.0,
        "latency": {"median": 1.0, "p99": 10.0, "seed": seed},
    }
    calls = rounds * width
    table = [
        "| hedging | runs | makespan (median) | min-max | extra requests | hedges (won) | correct |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    medians = {}
    walls: dict[str, list[float]] = {}
    for label, hedge in (("off", None), ("on (defaults)", True)):
        rows = []
        for rep in range(reps):
            config["latency"]["seed"] = seed + rep  # type: ignore[index]
            row = run_once(config, {"batch_max_concurrent": width, "hedge": hedge}, {})
            row.update(part="hedge", hedging=label, rep=rep)
            _print_row(row)
            rows.append(row)
        extra = [r["requests"] - 1 - calls for r in rows]
        medians[label] = _median(rows, "wall")
        walls[label] = [r["wall"] for r in rows]
        correct = sum(r["response"] == str(calls) for r in rows)
        table.append(
            f"| {label} | {reps} | {medians[label]:.2f} s | "
            f"{min(r['wall'] for r in rows):.2f}-{max(r['wall'] for r in rows):.2f} s | "
            f"{statistics.median(extra) / calls:.1%} (max {max(extra)}) | "
            f"{statistics.median(r['hedged'] for r in rows):g} "
            f"({statistics.median(r['hedges_won'] for r in rows):g}) | {correct}/{reps} |"
        )
    pairs = [on / off for on, off in zip(walls["on (defaults)"], walls["off"], strict=True)]
    table.append(
        f"\nmakespan with hedging / without: {medians['on (defaults)'] / medians['off']:.2f} "
        f"(medians), {sum(walls['on (defaults)']) / sum(walls['off']):.2f} (totals), "
        f"per seed {', '.join(f'{p:.2f}' for p in pairs)}"
    )
    return table


def _refused_by_round(row: dict[str, Any], rounds: int, width: int) -> list[int]:
    """Requests past ``width`` per round: each is a retry of a refused request."""
    sent = [0] * rounds
    for prompt in row["prompts"]:
        head = prompt.split("-")[0]
        if head.isdigit():
            sent[int(head)] += 1
    return [n - width for n in sent]


def part_tight(reps: int) -> list[str]:
    rounds, width = 8, 64
    config = {"root": _rounds(rounds, width), "turn": 0.0, "sub": 0.2, "max_in_flight": 6}
    table = [
        "| provider limit | makespan (median) | slots answered | refused / sent, first batch | refused / sent, 8 batches | limit at the end |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    walls = {}
    for label, backend in (
        ("adaptive (default)", {}),
        ("max_concurrent=4", {"max_concurrent": 4}),
        ("max_concurrent=6", {"max_concurrent": 6}),
        ("max_concurrent=8", {"max_concurrent": 8}),
        ("max_concurrent=16 (the old default)", {"max_concurrent": 16}),
    ):
        rows = []
        for rep in range(reps):
            row = run_once(config, {}, backend)
            row.update(part="tight", limit=label, rep=rep)
            _print_row(row)
            rows.append(row)
        walls[label] = _median(rows, "wall")
        first = [_refused_by_round(r, rounds, width)[0] for r in rows]
        refused_first = statistics.median(f / (width + f) for f in first)
        refused_all = statistics.median(r["refused"] / r["requests"] for r in rows)
        answered = statistics.median(
            int(r["response"]) if r["response"].isdigit() else 0 for r in rows
        )
        ends = ", ".join(str(r["limit_end"]) for r in rows if r["limit_end"] is not None) or "-"
        table.append(
            f"| {label} | {walls[label]:.2f} s | {answered:g} of {rounds * width} | "
            f"{refused_first:.1%} | {refused_all:.1%} | {ends} |"
        )
    best = min((w, k) for k, w in walls.items() if k.startswith("max_concurrent"))
    table.append(
        f"\nadaptive / the best given limit ({best[1]}): "
        f"{walls['adaptive (default)'] / best[0]:.2f}"
    )
    return table


def part_roomy(reps: int) -> list[str]:
    turn, sub = 0.1, 0.2
    shapes: list[tuple[str, dict[str, Any], dict[str, Any], float]] = [
        (
            "recursive 8 x 8, depth 2",
            {"root": RECURSIVE_ROOT, "child": RECURSIVE_CHILD, "turn": turn, "sub": sub},
            {"max_depth": 2},
            turn + 2 * (turn + sub),  # root turn; 8 children 4 at a time, one turn + 8 leaves
        ),
        (
            "fan-out 64",
            {"root": _rounds(1, 64), "turn": turn, "sub": sub},
            {},
            turn + 4 * sub,  # 16 at a time (batch_max_concurrent)
        ),
        (
            "fan-out 16 x 3 rounds",
            {"root": _rounds(3, 16), "turn": turn, "sub": sub},
            {},
            turn + 3 * sub,
        ),
    ]
    expected = {"recursive 8 x 8, depth 2": "64", "fan-out 64": "64", "fan-out 16 x 3 rounds": "48"}
    table = [
        "| scenario | ideal | provider limit | wall (median) | wall / ideal | peak in flight | correct |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, config, rlm_kwargs, ideal in shapes:
        for label, backend in (
            ("adaptive (default)", {}),
            ("fixed 16 (the old default)", {"max_concurrent": 16}),
        ):
            rows = []
            for rep in range(reps):
                row = run_once(config, rlm_kwargs, backend)
                row.update(part="roomy", scenario=name, limit=label, rep=rep)
                _print_row(row)
                rows.append(row)
            wall = _median(rows, "wall")
            correct = sum(r["response"] == expected[name] for r in rows)
            table.append(
                f"| {name} | {ideal:.2f} s | {label} | {wall:.3f} s | {wall / ideal:.2f} | "
                f"{max(r['peak_in_flight'] for r in rows)} | {correct}/{reps} |"
            )
    return table


def part_queue(reps: int) -> list[str]:
    wide = 1200
    root = (
        "got = []\nfor r in range(6):\n"
        "    got += llm_query_batched([f'w{r}-{i}' for i in range(8)])\n"
        f"got += llm_query_batched([f'b-{{i}}' for i in range({wide})])\n"
        "answer['content'] = str(sum(a.startswith('echo: ') for a in got))\n"
        "answer['ready'] = True"
    )
    config = {"root": root, "turn": 0.0, "sub": 0.05, "slots": 8}
    calls = 48 + wide
    table = [
        "| provider limit | makespan (median) | sub-calls answered | requests sent | sent again (timed out) | peak in flight at the server |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for label, backend in (
        ("adaptive (default)", {}),
        ("max_concurrent=8", {"max_concurrent": 8}),
        ("max_concurrent=64", {"max_concurrent": 64}),
    ):
        rows = []
        for rep in range(reps):
            row = run_once(
                config,
                {"batch_max_concurrent": wide},
                {"timeout": 3.0, "max_timeouts": 2, **backend},
            )
            row.update(part="queue", limit=label, rep=rep)
            _print_row(row)
            rows.append(row)
        answered = statistics.median(
            int(r["response"]) if r["response"].isdigit() else 0 for r in rows
        )
        table.append(
            f"| {label} | {_median(rows, 'wall'):.2f} s | {answered:g} of {calls} | "
            f"{_median(rows, 'requests'):g} | {_median(rows, 'requests') - calls - 1:g} | "
            f"{max(r['peak_in_flight'] for r in rows)} |"
        )
    return table


def _print_row(row: dict[str, Any]) -> None:
    shown = {k: v for k, v in row.items() if k != "prompts"}
    print(json.dumps(shown), flush=True)


PARTS: dict[str, Callable[[argparse.Namespace], list[str]]] = {
    "hedge": lambda a: part_hedge(a.reps, a.seed),
    "tight": lambda a: part_tight(a.reps),
    "roomy": lambda a: part_roomy(a.reps),
    "queue": lambda a: part_queue(a.reps),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--part", default="all", help="hedge, tight, roomy, queue (comma-separated) or all"
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7, help="the lognormal latencies' first seed")
    args = parser.parse_args()
    parts = list(PARTS) if args.part == "all" else args.part.split(",")
    tables = []
    for part in parts:
        tables.append(f"\n## {part}\n")
        tables.extend(PARTS[part](args))
    print("\n".join(tables))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
