"""Run rlm-graph on the bench scenarios; the twin of `bench/reference_driver.py`.

Run by `bench/run.py` as a subprocess of the project's venv, so that each engine is
measured in a process of its own. Modes:

    scripted   in-process, the first-party ``scripted`` provider playing the models
               (latency with ``trio.sleep``)
    direct     in-process, a minimal provider registered through the public plugin hook
               (``plugins=[...]``): no request log, no per-call introspection, so what is
               left is the engine's own cost
    http       the ``openai`` backend against the fake server (``--base-url``), with
               ``--transport httpx`` (httpx's own pool) or ``lean`` (our LeanTransport)

Writes one JSON object per run to ``--out`` (same fields as the reference driver, plus
what our result's graph knows: makespan, critical path, parallel efficiency, peak
concurrency, node counts).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Mapping
from typing import Any

import trio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scenarios

from rlm_graph import RLM, NodeKind
from rlm_graph.contracts import ChatRequest, ChatResponse, Usage
from rlm_graph.graph.analysis import counts_by_kind, makespan, peak_concurrency
from rlm_graph.hooks import hookimpl

NO_USAGE = Usage(input_tokens=10, output_tokens=5)


def as_dicts(request: ChatRequest) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in request.messages]


def is_sub_call(request: ChatRequest) -> bool:
    return not any(m.role == "system" for m in request.messages)


class FirstRequest:
    """Stamps (CLOCK_MONOTONIC) the first request an in-process provider sees."""

    def __init__(self) -> None:
        self.at: float | None = None

    def stamp(self) -> None:
        if self.at is None:
            self.at = time.clock_gettime(time.CLOCK_MONOTONIC)


class DirectProvider:
    """The least a `Provider` can do: play the scenario, sleep its latency, answer."""

    name = "bench-direct"

    def __init__(
        self, *, model_name: str, max_concurrent: int = 64, first: FirstRequest | None = None
    ) -> None:
        self.model = model_name
        self.max_concurrent = max_concurrent
        self.requests_per_minute = None
        self.tokens_per_minute = None
        self._first = first

    async def complete(self, request: ChatRequest) -> ChatResponse:
        if self._first is not None:
            self._first.stamp()
        if is_sub_call(request):
            text, latency = (
                scenarios.sub_answer(request.prompt),
                scenarios.get(self.model).sub_latency,
            )
        else:
            text, latency = scenarios.model_reply(self.model, as_dicts(request))
        if latency:
            await trio.sleep(latency)
        return ChatResponse(content=text, model=self.model, usage=NO_USAGE, finish_reason="stop")

    async def aclose(self) -> None:
        pass


class DirectPlugin:
    def __init__(self, first: FirstRequest) -> None:
        self.first = first

    @hookimpl
    def rlm_register_providers(self) -> Mapping[str, Any]:
        first = self.first
        return {"bench-direct": lambda **kw: DirectProvider(first=first, **kw)}


def scripted_kwargs(key: str, first: FirstRequest) -> dict[str, Any]:
    def respond(request: ChatRequest) -> str:
        first.stamp()
        return scenarios.model_reply(key, as_dicts(request))[0]

    def latency(request: ChatRequest) -> float:
        first.stamp()
        return scenarios.model_reply(key, as_dicts(request))[1]

    return {"model_name": key, "respond": respond, "latency": latency, "max_concurrent": 64}


PROVIDER_LIMIT: int | None = 64
"""``--provider-limit``: max_concurrent of the openai backend (None: adaptive)."""


def make_rlm(
    key: str,
    mode: str,
    base_url: str | None,
    transport: str,
    first: FirstRequest,
    journal: str | None = None,
) -> RLM:
    scenario = scenarios.get(key)
    common: dict[str, Any] = {
        "max_depth": scenario.max_depth,
        "max_iterations": 5,
        "batch_max_concurrent": 16,
        "max_concurrent_subcalls": 4,
        "journal": journal,
    }
    if mode == "scripted":
        return RLM("scripted", scripted_kwargs(key, first), **common)
    if mode == "direct":
        return RLM("bench-direct", {"model_name": key}, plugins=[DirectPlugin(first)], **common)
    if mode == "http":
        kwargs = {
            "model_name": key,
            "base_url": base_url,
            "api_key": "bench-not-a-key",
            "max_concurrent": PROVIDER_LIMIT,  # None: the adaptive limit (the default)
            "max_attempts": 1,
            "http_transport": transport,
        }
        return RLM("openai", kwargs, **common)
    raise SystemExit(f"unknown mode {mode!r}")


def graph_facts(result: Any) -> dict[str, Any]:
    graph = result.graph
    return {
        "nodes": len(graph),
        "counts": counts_by_kind(graph),
        "makespan": makespan(graph),
        "critical_path": result.critical_path.length,
        "parallel_efficiency": result.parallel_efficiency,
        "peak_llm_calls": peak_concurrency(graph, NodeKind.LLM_CALL),
        "peak_rlm_calls": peak_concurrency(graph, NodeKind.RLM_CALL),
    }


def payload_bytes(key: str) -> int:
    """Bytes of the sub-calls' prompts and answers themselves (str objects)."""
    n = scenarios.get(key).sub_calls
    prompts = sum(sys.getsizeof(f"sq {i}") for i in range(n))
    answers = sum(sys.getsizeof(str(i * i)) for i in range(n))
    return prompts + answers


SAMPLER: Any = None  # a bench/sampler.Sampler while --profile is on

CALLGRIND = False  # --callgrind: count instructions of the timed completion only


def callgrind(state: str) -> None:
    """Switch valgrind's instruction counting on or off for this process (the run is
    under ``valgrind --tool=callgrind --instr-atstart=no``; see bench/journal.py)."""
    if CALLGRIND:
        subprocess.run(
            ["callgrind_control", "-i", state, str(os.getpid())], check=True, capture_output=True
        )


def run_once(
    key: str,
    mode: str,
    rep: int,
    base_url: str | None,
    transport: str,
    memory: bool,
    journal_dir: str | None = None,
) -> dict[str, Any]:
    scenario = scenarios.get(key)
    first = FirstRequest()
    run_id = f"ours-{mode}-{transport}-{key.replace(':', '_')}-{rep}-{os.getpid()}"
    journal = os.path.join(journal_dir, f"{run_id}.sqlite") if journal_dir else None
    rlm = make_rlm(key, mode, base_url, transport, first, journal)
    if memory:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
    t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
    if SAMPLER is not None:
        SAMPLER.active = True
    callgrind("on")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = rlm.completion(
        "bench context", root_prompt=f"{scenarios.marker(run_id)} Compute the total."
    )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    callgrind("off")
    if SAMPLER is not None:
        SAMPLER.active = False
    row: dict[str, Any] = {}
    if memory:
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        row = {
            "mem_peak": peak - base,
            "mem_retained": current - base,
            "payload": payload_bytes(key),
        }
    row.update(
        engine="ours",
        mode=mode if mode != "http" else f"http/{transport}",
        scenario=key,
        rep=rep,
        run_id=run_id,
        t0=t0,
        first_in_process=(first.at - t0) if first.at is not None else None,
        wall=wall,
        cpu=cpu,
        response=result.response[:200],
        expected=scenario.expected,
        correct=result.response.strip() == scenario.expected,
        error=result.stop_reason,
        **graph_facts(result),
    )
    if journal is not None:
        row.update(journal_facts(journal, key, mode, base_url, transport, run_id))
    return row


def journal_facts(
    journal: str, key: str, mode: str, base_url: str | None, transport: str, run_id: str
) -> dict[str, Any]:
    """The journal's size per node, and the same completion again: a resume that
    replays every node without a request."""
    size = sum(
        os.path.getsize(journal + ext) for ext in ("", "-wal") if os.path.exists(journal + ext)
    )
    first = FirstRequest()
    again = make_rlm(key, mode, base_url, transport, first, journal)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = again.completion(
        "bench context", root_prompt=f"{scenarios.marker(run_id)} Compute the total."
    )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    replay = result.replay
    assert replay is not None and replay.live == 0, replay
    return {
        "journal": True,
        "journal_bytes": size,
        "journal_nodes": len(result.graph),
        "replay_wall": wall,
        "replay_cpu": cpu,
        "replayed": replay.replayed,
        "replay_correct": result.response.strip() == scenarios.get(key).expected,
        "replay_requests": first.at is not None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("scripted", "direct", "http"), required=True)
    parser.add_argument("--base-url")
    parser.add_argument("--transport", choices=("httpx", "lean"), default="httpx")
    parser.add_argument("--scenario", action="append", required=True)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--memory", action="store_true", help="trace memory (tracemalloc)")
    parser.add_argument(
        "--profile", help="sample the runs' stacks (bench/sampler.py); write the report here"
    )
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--journal",
        metavar="DIR",
        help="journal each run to a new file in DIR, then time its replay",
    )
    parser.add_argument(
        "--callgrind", action="store_true", help="under valgrind: count only the timed completion"
    )
    parser.add_argument(
        "--provider-limit",
        default="64",
        help="the openai backend's max_concurrent over HTTP (default 64, above what any "
        "scenario uses); 'default': none given, the adaptive limit",
    )
    args = parser.parse_args()
    global SAMPLER, CALLGRIND, PROVIDER_LIMIT
    CALLGRIND = args.callgrind
    PROVIDER_LIMIT = None if args.provider_limit == "default" else int(args.provider_limit)
    if args.profile:
        from sampler import Sampler

        SAMPLER = Sampler(interval=0.001)
        SAMPLER.active = False
        SAMPLER.__enter__()
    with open(args.out, "a") as out:
        for key in args.scenario:
            for rep in range(args.reps):
                row = run_once(
                    key, args.mode, rep, args.base_url, args.transport, args.memory, args.journal
                )
                out.write(json.dumps(row) + "\n")
                out.flush()
    if SAMPLER is not None:
        SAMPLER.__exit__(None, None, None)
        with open(args.profile, "w") as f:
            f.write(SAMPLER.report(top=45) + "\n")


if __name__ == "__main__":
    main()
