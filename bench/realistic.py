"""A benchmark that looks like a real run: streamed root replies, blocks that run as they
are written, prompt caching priced right.

    .venv/bin/python bench/realistic.py [--turns 10] [--reps 2] [--reference]
    .venv/bin/python bench/realistic.py --cpu-only [--reps 5] [--profile FILE]

What it does:
    1. starts the fake OpenAI server (`bench/fake_server.py`) in a process of its own;
    2. runs the ``realistic:N`` scenario (bench/scenarios.py): N root turns, each reply a
       ```repl block (a batch of 8 sub-calls of 1.5 s) and then commentary, generated at
       50 tokens/s after a first token at 0.5 s; with ``backend_kwargs`` ``stream`` on
       (blocks start when their closing fence arrives) and off (the reply comes whole),
       one after the other, ``--reps`` times; with ``--reference`` also the reference
       library (PyPI ``rlms`` in ``bench/.venv-rlms``, see bench/run.py), which does not
       stream;
    3. reports each run's wall time against the critical path of model time: per turn,
       max(generation of the whole reply, generation up to the block's closing fence +
       the sub-call round), the best any engine can do with blocks that run as they are
       written (and, for comparison, the same model time run one after the other);
    4. prices the root turns' input at gpt-5's published rates (USD 1.25 per million
       input tokens, 0.125 cached) from the server's usage, and the same trajectory
       against the Anthropic fake (`rlm_graph.testing.FakeAnthropicServer`, which caches
       what ``cache_control`` marks) at claude-sonnet-4-5's (3.00; 0.30 cache read,
       3.75 cache write), each with and without the cache;
    5. measures the engine's CPU per reply: 32 root replies through the provider,
       streamed and whole, 16 at a time (alone with ``--cpu-only``: streamed and whole
       in turn, ``--reps`` times, then the medians; ``--profile FILE`` writes a
       cProfile of the streamed replies' CPU there), and the floor under a streamed
       reply's CPU: 16 tasks waking on the ticks a reply is read at, nothing read.

Run by hand, never by the test suite. Prints a Markdown report (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import scenarios  # noqa: E402 - from this folder, on the path above
from run import REF_PYTHON, Server, ensure_reference_venv  # noqa: E402

from rlm_graph import RLM, NodeKind  # noqa: E402
from rlm_graph._http.pacing import next_tick, ticker  # noqa: E402 - the floor's ticks
from rlm_graph.contracts import ChatRequest, Message, ModelInfo, Usage  # noqa: E402
from rlm_graph.http import JSONProvider  # noqa: E402
from rlm_graph.testing import FakeAnthropicServer  # noqa: E402
from rlm_graph_openai import OpenAIProvider  # noqa: E402

GPT5 = ModelInfo(input_usd_per_mtok=1.25, output_usd_per_mtok=10.0, cached_input_usd_per_mtok=0.125)
SONNET = ModelInfo(
    input_usd_per_mtok=3.0,
    output_usd_per_mtok=15.0,
    cached_input_usd_per_mtok=0.30,
    cache_write_usd_per_mtok=3.75,
)


def ideal(scenario: scenarios.Scenario) -> tuple[float, float]:
    """The critical path of model time: pipelined (a turn costs the longer of its
    generation and its block's end + the sub-call round), and one after the other."""
    pipelined = serial = 0.0
    for reply in scenario.root_turns:
        to_block, whole = scenarios.generation(scenario, reply)
        calls = scenario.sub_latency if "llm_query" in reply else 0.0
        pipelined += max(whole, to_block + calls)
        serial += whole + calls
    return pipelined, serial


def context_text(scenario: scenarios.Scenario) -> str:
    words = "the quick brown fox jumps over the lazy dog and keeps on running "
    size = int(scenario.extra["context_chars"])
    return (words * (size // len(words) + 1))[:size]


def run_ours(key: str, base_url: str, stream: bool, rep: int) -> dict[str, Any]:
    scenario = scenarios.get(key)
    rlm = RLM(
        "openai",
        {
            "model_name": key,
            "base_url": base_url,
            "api_key": "bench-not-a-key",
            "stream": stream,
            "max_concurrent": 64,
            "timeout": 60,
        },
        max_iterations=int(scenario.extra["max_iterations"]),
        models={key: GPT5.model_dump(exclude_none=True)},
    )
    run_id = f"ours-{'stream' if stream else 'whole'}-{rep}-{os.getpid()}"
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = rlm.completion(
        context_text(scenario), root_prompt=f"{scenarios.marker(run_id)} Compute the total."
    )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    rlm.close()
    turns = [r for r in result.graph.records(NodeKind.ROOT_TURN) if r.usage is not None]
    usage = sum((r.usage for r in turns if r.usage is not None), Usage())
    return {
        "engine": "ours",
        "stream": stream,
        "wall": wall,
        "cpu": cpu,
        "correct": result.response == scenario.expected,
        "turns": len(turns),
        "root_input": usage.input_tokens,
        "root_cached": usage.cached_tokens,
        "root_cost_cached": sum(GPT5.price(_input_only(r.usage)) or 0.0 for r in turns),
        "root_cost_uncached": sum(GPT5.price(_uncached(r.usage)) or 0.0 for r in turns),
        "critical_path": result.critical_path.length,
    }


def _input_only(usage: Usage | None) -> Usage:
    usage = usage or Usage()
    return Usage(input_tokens=usage.input_tokens, cached_tokens=usage.cached_tokens)


def _uncached(usage: Usage | None) -> Usage:
    return Usage(input_tokens=(usage or Usage()).input_tokens)


def run_reference(key: str, base_url: str, out: Path) -> dict[str, Any] | None:
    ensure_reference_venv()
    if out.exists():
        out.unlink()
    command = [str(REF_PYTHON), str(HERE / "reference_driver.py"), "--base-url", base_url]
    command += ["--scenario", key]
    done = subprocess.run([*command, "--reps", "1", "--out", str(out)], timeout=900, check=False)
    if done.returncode != 0 or not out.exists():
        return None
    row = json.loads(out.read_text().splitlines()[0])
    return {"engine": "reference", "stream": False, **row}


def anthropic_costs(key: str) -> dict[str, float]:
    """The same trajectory through the Anthropic provider (which marks each root turn's
    prefix with cache_control) against the Anthropic fake and its prompt cache."""
    scenario = scenarios.get(key)

    def respond(body: dict[str, Any]) -> str:
        system = [{"role": "system", "content": "x"}] if body.get("system") else []
        messages = [{"role": m["role"], "content": _text(m["content"])} for m in body["messages"]]
        return scenarios.model_reply(key, [*system, *messages])[0]

    with FakeAnthropicServer(respond, prompt_cache=True) as server:
        rlm = RLM(
            "anthropic",
            {"model_name": "claude-bench", "base_url": server.base_url, "api_key": "k"},
            max_iterations=int(scenario.extra["max_iterations"]),
        )
        result = rlm.completion(
            context_text(scenario), root_prompt=f"{scenarios.marker('anthropic')} Compute."
        )
        rlm.close()
    turns = [r.usage for r in result.graph.records(NodeKind.ROOT_TURN) if r.usage is not None]
    cached = sum(SONNET.price(_anthropic_input(u)) or 0.0 for u in turns)
    uncached = sum(SONNET.price(_uncached(u)) or 0.0 for u in turns)
    return {
        "correct": float(result.response == scenario.expected),
        "cached": cached,
        "uncached": uncached,
        "read": float(sum(u.cached_tokens for u in turns)),
        "written": float(sum(u.cache_write_tokens for u in turns)),
        "input": float(sum(u.input_tokens for u in turns)),
    }


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(block.get("text", "")) for block in content)
    return str(content)


def _anthropic_input(usage: Usage) -> Usage:
    return Usage(
        input_tokens=usage.input_tokens,
        cached_tokens=usage.cached_tokens,
        cache_write_tokens=usage.cache_write_tokens,
    )


async def _replies(
    base_url: str, key: str, stream: bool, n: int, width: int, profile: Any = None
) -> float:
    """CPU seconds for ``n`` root replies, ``width`` at a time, streamed or whole (with
    ``profile``, a ``cProfile.Profile``, enabled over the counted waves)."""
    provider = OpenAIProvider(
        backend="vllm", model_name=key, base_url=base_url, max_concurrent=width, stream=stream
    )
    system = Message(role="system", content="You answer with code.")

    async def one(i: int) -> None:
        marker = scenarios.marker(f"cpu-{stream}-{i}")
        request = ChatRequest(
            messages=(system, Message(role="user", content=f"{marker} go")), model=key
        )
        text: list[str] = []
        reply = await provider.stream(request, lambda offset, piece: text.append(piece))
        assert reply.content == "".join(text)

    async def wave(first: int) -> None:
        async with trio.open_nursery() as nursery:
            for i in range(first, min(first + width, n)):
                nursery.start_soon(one, i)

    await wave(0)  # a warm-up wave, not counted
    if profile is not None:
        profile.enable()
    cpu0 = time.process_time()
    for first in range(0, n, width):
        await wave(first)
    cpu = time.process_time() - cpu0
    if profile is not None:
        profile.disable()
    await provider.aclose()
    return cpu / n


async def _ticks_alone(ticks: int, width: int) -> float:
    """CPU seconds a stream for ``width`` tasks that wake on the same ``ticks`` instants
    a paced stream reads at, the transport's shared ticks, with nothing to read or
    parse: the floor under a streamed reply's CPU on this machine (its wake-ups)."""
    pace = JSONProvider.stream_interval

    async def one() -> None:
        tick = -math.inf
        for _ in range(ticks):
            if trio.current_time() < tick:
                await ticker(pace).wait_until(tick)
            tick = next_tick(trio.current_time(), pace)

    cpu0 = time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(width):
            nursery.start_soon(one)
    return (time.process_time() - cpu0) / width


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, trio {trio.__version__}"


def report(
    key: str, rows: list[dict[str, Any]], costs: dict[str, float], cpu: dict[str, float]
) -> str:
    scenario = scenarios.get(key)
    pipelined, serial = ideal(scenario)
    lines = [
        f"Scenario `{key}`: {scenario.description}.",
        f"Critical path of model time: {pipelined:.2f} s with blocks running as they are "
        f"written, {serial:.2f} s one after the other.",
        "",
        "| engine | streaming | runs | wall (median) | wall / critical path | engine CPU | correct |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for engine, stream in (("ours", True), ("ours", False), ("reference", False)):
        mine = [r for r in rows if r["engine"] == engine and r["stream"] == stream]
        if not mine:
            continue
        wall = statistics.median(r["wall"] for r in mine)
        cpu_s = statistics.median(r["cpu"] for r in mine)
        ok = sum(bool(r["correct"]) for r in mine)
        lines.append(
            f"| {engine} | {'on' if stream else 'off'} | {len(mine)} | {wall:.2f} s | "
            f"{wall / pipelined:.3f}x | {cpu_s:.2f} s | {ok}/{len(mine)} |"
        )
    on = [r for r in rows if r["engine"] == "ours" and r["stream"]]
    off = [r for r in rows if r["engine"] == "ours" and not r["stream"]]
    if on and off:
        saved = 1 - statistics.median(r["wall"] for r in on) / statistics.median(
            r["wall"] for r in off
        )
        lines += ["", f"Streaming on saves {saved:.1%} of the wall time of streaming off."]
    if on:
        first = on[0]
        lines += [
            "",
            "Root-turn input, priced (the server's usage of one streamed run):",
            "",
            "| pricing | input tokens | cached | with the cache | without | ratio |",
            "| --- | --- | --- | --- | --- | --- |",
            f"| gpt-5 (automatic cache; 1.25 / 0.125 USD per Mtok) | {first['root_input']:,} | "
            f"{first['root_cached']:,} | ${first['root_cost_cached']:.5f} | "
            f"${first['root_cost_uncached']:.5f} | "
            f"{first['root_cost_cached'] / first['root_cost_uncached']:.1%} |",
            f"| claude-sonnet-4-5 (cache_control; 3.00 / 0.30 read / 3.75 write) | "
            f"{int(costs['input']):,} | {int(costs['read']):,} read, {int(costs['written']):,} written | "
            f"${costs['cached']:.5f} | ${costs['uncached']:.5f} | "
            f"{costs['cached'] / costs['uncached']:.1%} |",
        ]
    lines += [
        "",
        f"Engine CPU per root reply (32 replies, 16 at a time, through the provider): "
        f"streamed {cpu['stream'] * 1000:.2f} ms, whole {cpu['whole'] * 1000:.2f} ms "
        f"({cpu['stream'] / cpu['whole']:.2f}x).",
    ]
    return "\n".join(lines)


def cpu_only(key: str, reps: int, profile_to: str | None) -> None:
    """The CPU per reply alone: streamed and whole in turn, ``reps`` times (the machine
    is shared and noisy: alternating keeps both under the same load)."""
    profile = cProfile.Profile(time.process_time) if profile_to else None
    figures: dict[str, list[float]] = {"stream": [], "whole": []}
    with Server() as server:
        for _ in range(reps):
            for stream in (True, False):
                watched = profile if stream else None
                cpu = trio.run(_replies, server.base_url, key, stream, 32, 16, watched)
                figures["stream" if stream else "whole"].append(cpu)
                print(json.dumps({"stream": stream, "cpu_ms": round(cpu * 1000, 3)}), flush=True)
    if profile is not None and profile_to:
        profile.dump_stats(profile_to)
    on, off = statistics.median(figures["stream"]), statistics.median(figures["whole"])
    scenario = scenarios.get(key)
    ticks = round(
        scenarios.generation(scenario, scenario.root_turns[0])[1] / JSONProvider.stream_interval
    )
    floor = statistics.median(trio.run(_ticks_alone, ticks, 16) for _ in range(reps))
    print(f"machine: {machine()}")
    print(
        f"Engine CPU per root reply (32 replies, 16 at a time, median of {reps}): "
        f"streamed {on * 1000:.2f} ms, whole {off * 1000:.2f} ms ({on / off:.2f}x)."
    )
    print(
        f"The floor: 16 tasks waking on the {ticks} shared ticks a streamed reply is read "
        f"at, with nothing to read: {floor * 1000:.2f} ms a task ({floor / off:.2f}x a "
        "whole reply)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--reference", action="store_true", help="also run the reference")
    parser.add_argument("--cpu-only", action="store_true", help="only the CPU per reply")
    parser.add_argument("--profile", metavar="FILE", help="with --cpu-only: a cProfile")
    args = parser.parse_args()
    key = f"realistic:{args.turns}"
    if args.cpu_only:
        cpu_only(key, args.reps, args.profile)
        return
    rows: list[dict[str, Any]] = []
    print(f"machine: {machine()}", flush=True)
    with Server() as server:
        for rep in range(args.reps):
            for stream in (True, False):
                row = run_ours(key, server.base_url, stream, rep)
                rows.append(row)
                print(json.dumps(row), flush=True)
        if args.reference:
            (HERE / "results").mkdir(exist_ok=True)
            found = run_reference(key, server.base_url, HERE / "results" / "realistic-ref.jsonl")
            if found is not None:
                rows.append(found)
                print(json.dumps(found), flush=True)
        cpu = {
            "stream": trio.run(_replies, server.base_url, key, True, 32, 16),
            "whole": trio.run(_replies, server.base_url, key, False, 32, 16),
        }
    costs = anthropic_costs(key)
    print()
    print(f"machine: {machine()}")
    print(report(key, rows, costs, cpu))


if __name__ == "__main__":
    main()
