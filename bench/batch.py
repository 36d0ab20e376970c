"""Benchmark batches: many completions through the local and the ray executor.

    .venv/bin/python bench/batch.py --items 200 --sub-calls 8 --concurrency 20 --executor local,ray

Each completion is one root turn whose code sends ``--sub-calls`` sub-calls in one
``llm_query_batched`` over the item's own context, and answers their sum (checked for
every item). Latency is the fake OpenAI server's (`bench/fake_server.py`, its own
process, asyncio): it sleeps 100 ms before every answer, root turn and sub-call alike, so
both executors face the same model over real HTTP and a completion's ideal is 200 ms.
The provider limit (``max_concurrent``) is set above what the batch can use so that it
never binds: what the wall clock shows beyond the ideal is the engine's own cost.

ideal = ceil(items / concurrency) * 200 ms (waves of ``concurrency`` completions).
For ray, the script starts a local cluster with this machine's CPUs, reserves
CPUs / concurrency per task so that ``concurrency`` tasks fit, and runs a warm-up batch
first so that Ray's worker processes exist before the clock starts (the local executor
gets a warm-up batch too). "Engine CPU per completion" is this process's CPU time
(``time.process_time``) over the timed batch divided by the items: for local, all of the
engine's work; for ray, the driver's share only (the completions run in Ray's worker
processes). Run by hand, never by the test suite.

``--instructions`` counts machine instructions per completion instead (local executor):
the script runs itself under valgrind (callgrind, counting only the timed batch, threads
included; the fake server is not counted). Instructions do not depend on what else the
machine runs, so that is the figure to compare two versions of the engine by on a noisy
machine; CPU seconds also pay for cache misses and the kernel, which it does not see.

    .venv/bin/python bench/batch.py --instructions --items 50 --provider http

``--floor`` (with ``--instructions``: its instructions per completion, thread hop
included) runs the batch's shape with no engine at all, over raw trio sockets against
the same server: per completion one request, then a hop into a worker thread whose code
asks trio for ``--sub-calls`` requests at once (as a block's ``llm_query_batched`` does),
``--concurrency`` completions at a time; and the same without the thread hop. Its wall /
ideal and CPU per completion are what this machine costs before the engine does anything.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import scenarios  # noqa: E402
from http_transport import raw_exchange  # noqa: E402
from run import Server  # noqa: E402

from rlm_graph import run_batch  # noqa: E402
from rlm_graph.batch import BatchSummary  # noqa: E402


def make_items(n: int, sub_calls: int, run_id: str) -> list[dict[str, Any]]:
    query = f"{scenarios.marker(run_id)} Add up the squares."
    return [{"id": f"b{i}", "context": str(1000 * i), "query": query} for i in range(n)]


def expected(item_id: str, sub_calls: int) -> str:
    base = 1000 * int(item_id[1:])
    return str(sum((base + i) ** 2 for i in range(sub_calls)))


def scripted_reply(request: Any) -> str:
    """The scripted provider's side of scenario ``batch:N`` (same text as the server's)."""
    messages = [{"role": m.role, "content": m.content} for m in request.messages]
    return scenarios.model_reply(request.model, messages)[0]


def backend(provider: str, server: Server, sub_calls: int, concurrency: int) -> dict[str, Any]:
    model = f"batch:{sub_calls}"
    if provider == "scripted":
        # In-process model: trio.sleep(0.1) per call, no HTTP (runs in Ray workers too:
        # this script is __main__, so Ray pickles scripted_reply by value).
        return {
            "backend": "scripted",
            "backend_kwargs": {
                "model_name": model,
                "respond": scripted_reply,
                "latency": 0.1,
                "max_concurrent": concurrency * (sub_calls + 1),
            },
        }
    return {
        "backend": "openai",
        "backend_kwargs": {
            "model_name": model,
            "base_url": server.base_url,
            "api_key": "sk-bench-not-a-key",
            "max_concurrent": concurrency * (sub_calls + 1),
        },
    }


def one_batch(
    server: Server,
    executor: str,
    n: int,
    sub_calls: int,
    concurrency: int,
    run_id: str,
    executor_kwargs: dict[str, Any],
    provider: str,
) -> dict[str, Any]:
    rlm_kwargs = backend(provider, server, sub_calls, concurrency)
    cpu, wall = time.process_time(), time.perf_counter()
    results = list(
        run_batch(
            make_items(n, sub_calls, run_id),
            rlm_kwargs,
            concurrency=concurrency,
            executor=executor,
            executor_kwargs=executor_kwargs,
        )
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    wrong = [r.id for r in results if r.answer != expected(r.id, sub_calls)]
    if wrong or len(results) != n:
        raise SystemExit(
            f"{executor}: {len(wrong)} wrong answers ({wrong[:3]}), {len(results)} of {n} results"
        )
    summary = BatchSummary.of(results)
    return {
        "wall": wall,
        "cpu_per_completion_ms": 1000 * cpu / n,
        "p50": summary.p50_seconds,
        "p95": summary.p95_seconds,
    }


def count_instructions(args: argparse.Namespace) -> None:
    """Run this script under callgrind (`--callgrind-child`); print instructions per
    completion of the timed batch."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--callgrind-child",
        f"--items={args.items}",
        f"--sub-calls={args.sub_calls}",
        f"--concurrency={args.concurrency}",
        f"--provider={args.provider}",
    ] + (["--floor"] if args.floor else [])
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    found = re.search(r"Collected : ([\d,]+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    per = int(found.group(1).replace(",", "")) / args.items
    what = "floor (raw trio, thread hop)" if args.floor else args.provider
    print(f"| {what} | {args.items} | {per / 1e6:.2f} M |")


def callgrind_child(args: argparse.Namespace, server: Server) -> None:
    """Under callgrind: a warm-up batch uncounted, then the timed batch counted (with
    ``--floor``, the floor's shape with its thread hop instead of the engine)."""
    import trio

    def batch(items: int, run_id: str) -> None:
        if args.floor:
            trio.run(_floor_batch, server.base_url, args, items, True)
        else:
            one_batch(
                server, "local", items, args.sub_calls, args.concurrency, run_id, {}, args.provider
            )

    batch(args.concurrency * 2, "warm-local")
    pid = str(os.getpid())
    subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
    batch(args.items, "counted")
    subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)


async def _floor_batch(base_url: str, args: argparse.Namespace, items: int, hop: bool) -> None:
    """`--floor`: the batch's requests and thread hops over raw trio sockets."""
    import json

    import httpx
    import trio

    url = httpx.URL(base_url + "/chat/completions")
    head = f"POST {url.raw_path.decode()} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
    idle: list[trio.SocketStream] = []

    async def request(i: int) -> Any:
        body = json.dumps(
            {
                "model": f"batch:{args.sub_calls}",
                "messages": [{"role": "user", "content": f"sq {i}"}],
            }
        ).encode()
        stream = idle.pop() if idle else await trio.open_tcp_stream(url.host, url.port or 80)
        request = f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
        answer = await raw_exchange(stream, request)
        idle.append(stream)
        return json.loads(answer)

    async def sub_calls() -> None:
        async with trio.open_nursery() as nursery:
            for k in range(args.sub_calls):
                nursery.start_soon(request, k)

    async def completion(i: int) -> None:
        await request(i)
        if hop:
            await trio.to_thread.run_sync(trio.from_thread.run, sub_calls)
        else:
            await sub_calls()

    todo = list(range(items))

    async def worker() -> None:
        while todo:
            await completion(todo.pop())

    async with trio.open_nursery() as nursery:
        for _ in range(args.concurrency):
            nursery.start_soon(worker)
    for stream in idle:
        await stream.aclose()


def floor(args: argparse.Namespace, server: Server) -> None:
    """`--floor`: wall / ideal and CPU per completion with no engine (see the docstring)."""
    import trio

    ideal = math.ceil(args.items / args.concurrency) * 0.2
    print("| shape | wall / ideal | CPU per completion |")
    print("| --- | ---: | ---: |")
    for hop in (True, False):
        trio.run(_floor_batch, server.base_url, args, args.concurrency * 2, hop)
        for _ in range(args.repeat):
            cpu, wall = time.process_time(), time.perf_counter()
            trio.run(_floor_batch, server.base_url, args, args.items, hop)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            shape = "request, thread hop, sub-calls" if hop else "request, sub-calls (no hop)"
            print(f"| {shape} | {wall / ideal:.3f} | {1000 * cpu / args.items:.2f} ms |")


def bench(executor: str, args: argparse.Namespace, server: Server) -> list[dict[str, Any]]:
    kwargs: dict[str, Any] = {}
    if executor == "ray":
        import ray

        cpus = os.cpu_count() or 1
        ray.init(
            num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False
        )
        kwargs = {"task_cpus": cpus / args.concurrency}
    one_batch(
        server,
        executor,
        args.concurrency * 2,
        args.sub_calls,
        args.concurrency,
        f"warm-{executor}",
        kwargs,
        args.provider,
    )
    runs = []
    for rep in range(args.repeat):
        runs.append(
            one_batch(
                server,
                executor,
                args.items,
                args.sub_calls,
                args.concurrency,
                f"{executor}-{rep}",
                kwargs,
                args.provider,
            )
        )
        print(f"  {executor} run {rep + 1}: {runs[-1]['wall']:.3f} s", flush=True)
    return runs


def _probe_task(rlm_kwargs: dict[str, Any], actor: Any, n: int) -> tuple[float, float]:
    """One completion inside a Ray task, built as the executor builds it, with the actor's
    limiter (``actor``) or an in-process one (None): (seconds inside, worker CPU seconds)."""
    import trio

    from rlm_graph import RLM
    from rlm_graph.executors import BatchItem, InProcessLimiter, complete_item
    from rlm_graph_ray.limits_actor import RayLimiter

    limiter = (
        RayLimiter(actor, batch="probe", owner=f"probe/{n}")
        if actor is not None
        else InProcessLimiter()
    )
    item = BatchItem(id=f"b{n}", context=str(1000 * n), query=f"{scenarios.marker('probe')} q")

    async def answer() -> Any:
        async with RLM(**rlm_kwargs, limiter=limiter) as rlm:
            return await complete_item(rlm, item, executor="probe")

    cpu = time.process_time()
    result = trio.run(answer)
    return result.seconds, time.process_time() - cpu


def probe_ray(args: argparse.Namespace, server: Server) -> None:
    """Where Ray's time goes: the same completion in a bare Ray task, once with an
    in-process limiter and once with the limits actor; the worker's CPU per completion."""
    import ray

    from rlm_graph_ray.limits_actor import ClusterLimits

    ray.init(
        num_cpus=os.cpu_count() or 1,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    actor = ray.remote(ClusterLimits).options(num_cpus=0).remote()
    ray.get(actor.statistics.remote())
    task = ray.remote(_probe_task).options(num_cpus=(os.cpu_count() or 1) / args.concurrency)
    rlm_kwargs = backend(args.provider, server, args.sub_calls, args.concurrency)
    for rep in range(args.repeat + 1):  # the first round starts the worker processes
        for name, handle in (("in-process limiter", None), ("limits actor", actor)):
            runs = ray.get([task.remote(rlm_kwargs, handle, n) for n in range(args.items)])
            if rep:
                print(
                    f"| {name} | {statistics.median(r[0] for r in runs):.3f} s | "
                    f"{1000 * statistics.median(r[1] for r in runs):.1f} ms |"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--sub-calls", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--executor", default="local,ray")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--probe-ray-tasks",
        action="store_true",
        help="instead: --items bare Ray tasks, --concurrency at once, each one completion "
        "with an in-process limiter, then with the limits actor (p50 inside, worker CPU)",
    )
    parser.add_argument(
        "--provider",
        choices=("http", "scripted"),
        default="http",
        help="http: the fake OpenAI server sleeps 100 ms per answer; scripted: the "
        "in-process scripted provider sleeps 100 ms (trio.sleep), no HTTP",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="instead: instructions per completion (local executor), counted under valgrind",
    )
    parser.add_argument("--callgrind-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--floor",
        action="store_true",
        help="instead: the batch's requests and thread hops over raw trio sockets, no engine",
    )
    args = parser.parse_args()
    if args.instructions:
        print("| provider | completions | instructions per completion |")
        print("| --- | ---: | ---: |")
        count_instructions(args)
        return
    if args.callgrind_child or args.floor:
        with Server() as server:
            (callgrind_child if args.callgrind_child else floor)(args, server)
        return
    ideal = math.ceil(args.items / args.concurrency) * 0.2
    print(f"load average (1 min) at the start: {os.getloadavg()[0]:.2f}")
    print(
        f"{args.items} completions x {args.sub_calls} sub-calls, concurrency {args.concurrency}, "
        f"{args.provider} provider, ideal {ideal:.2f} s"
    )
    table = {}
    if args.probe_ray_tasks:
        with Server() as server:
            print("| limiter | p50 seconds inside a completion | worker CPU per completion |")
            print("| --- | ---: | ---: |")
            probe_ray(args, server)
        return
    with Server() as server:
        for executor in args.executor.split(","):
            table[executor] = bench(executor, args, server)
    print(
        "\n| executor | wall s (best / median) | wall / ideal (best / median) | p50 / p95 s per completion | driver CPU ms per completion |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for executor, runs in table.items():
        best = min(runs, key=lambda r: r["wall"])
        median = statistics.median(r["wall"] for r in runs)
        print(
            f"| {executor} | {best['wall']:.3f} / {median:.3f} | {best['wall'] / ideal:.3f} / {median / ideal:.3f} | "
            f"{best['p50']:.3f} / {best['p95']:.3f} | {best['cpu_per_completion_ms']:.2f} |"
        )
    if "local" in table and "ray" in table:
        ratio = min(r["wall"] for r in table["ray"]) / min(r["wall"] for r in table["local"])
        middle = statistics.median(r["wall"] for r in table["ray"]) / statistics.median(
            r["wall"] for r in table["local"]
        )
        print(f"\nray / local: {ratio:.2f} (best walls), {middle:.2f} (median walls)")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
