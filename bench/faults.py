"""Fault tolerance at scale: one ``llm_query_batched`` of 1,000 prompts against a server
that answers a share of requests with a fault.

The seven faults, equally likely: 429 with ``Retry-After: 0``, 500, 503, a connection
reset mid-response, a 200 with truncated JSON, an empty 200, and a hang longer than the
timeout (the server says nothing until the client hangs up). Whether a request faults,
and how, is drawn from ``(seed, prompt, attempt number)``, so a run is reproducible
whatever the order requests arrive in; each attempt faults independently with the given
probability.

Prints, per fault rate: correct slots (the right answer in the right place), ``[ERROR]``
slots, requests the server saw, duplicate POSTs (a prompt sent again after the server had
answered it in full: must be 0), and wall time. The engine runs with its default
settings except the provider's ``timeout``, 1 s here instead of 60 so that the hang
fault costs seconds, not minutes (each attempt after a timeout gets twice as long: 1, 2,
4 s; the third timeout in a row fails the slot, ``max_timeouts``).

Run: ``.venv/bin/python bench/faults.py`` (``--rates 0 0.2 0.5``, ``--prompts 1000``,
``--max-attempts 10``, ``--seed 0``). The root model is the same fake server, never
faulted, so what is measured is the batch. Results and the machine go to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import sys
import threading
import time
from typing import Any

from rlm_graph import RLM
from rlm_graph.testing import FakeOpenAIServer, Reply, last_user_message

KINDS = ("429", "500", "503", "reset", "truncated", "empty", "hang")
CODE = """
answers = llm_query_batched([f"question {{i}}" for i in range({n})])
wrong = [i for i, a in enumerate(answers) if a != f"answer {{i}}"]
errors = sum(a.startswith("[ERROR]") for a in answers)
FINAL(f"{{len(answers) - len(wrong)}} {{errors}}")
"""
_PROMPT = re.compile(r"question (\d+)$")


class FaultyModel:
    """The server's responder: the root turn gets the code; each sub-call an answer or a
    fault, drawn per (seed, prompt, attempt)."""

    def __init__(self, prompts: int, rate: float, seed: int) -> None:
        self.prompts = prompts
        self.rate = rate
        self.seed = seed
        self.lock = threading.Lock()
        self.attempts: dict[int, int] = {}
        self.answered: set[int] = set()
        self.duplicates = 0
        self.faults = dict.fromkeys(KINDS, 0)

    def __call__(self, body: dict[str, Any]) -> Any:
        if any(m.get("role") == "system" for m in body["messages"]):
            return "```repl\n" + CODE.format(n=self.prompts) + "\n```"
        match = _PROMPT.search(last_user_message(body))
        if match is None:
            return "unexpected prompt"
        index = int(match.group(1))
        with self.lock:
            if index in self.answered:
                self.duplicates += 1
            attempt = self.attempts[index] = self.attempts.get(index, 0) + 1
        draw = random.Random(f"{self.seed}:{index}:{attempt}")
        if draw.random() >= self.rate:
            with self.lock:
                self.answered.add(index)
            return f"answer {index}"
        kind = draw.choice(KINDS)
        with self.lock:
            self.faults[kind] += 1
        return fault(kind)


def fault(kind: str) -> Reply:
    if kind == "429":
        return Reply.error(429, "Rate limit reached", retry_after="0")
    if kind in ("500", "503"):
        return Reply.error(int(kind), "server error")
    if kind == "reset":
        return Reply.reset("never whole")
    if kind == "truncated":
        return Reply.truncated("never whole")
    if kind == "empty":
        return Reply.empty()
    return Reply.hang(120.0)


def run_one(
    prompts: int, rate: float, seed: int, max_attempts: int | None, timeout: float
) -> dict[str, Any]:
    model = FaultyModel(prompts, rate, seed)
    kwargs: dict[str, Any] = {"model_name": "bench", "timeout": timeout}
    if max_attempts is not None:
        kwargs["max_attempts"] = max_attempts
    with FakeOpenAIServer(model) as server:
        kwargs["base_url"] = server.base_url
        rlm = RLM("vllm", kwargs, max_iterations=2)
        start = time.perf_counter()
        result = rlm.completion("unused", root_prompt="answer every question")
        wall = time.perf_counter() - start
        requests = len(server.requests)
    correct, errors = (int(x) for x in result.response.split())
    return {
        "rate": rate,
        "correct": correct,
        "errors": errors,
        "requests": requests,
        "duplicates": model.duplicates,
        "wall": wall,
        "faults": model.faults,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.2, 0.5])
    parser.add_argument("--prompts", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-attempts", type=int, default=None, help="default: the provider's")
    parser.add_argument("--timeout", type=float, default=1.0, help="provider timeout, seconds")
    args = parser.parse_args(argv)
    # The engine's one summary line per run shows what was retried.
    logging.basicConfig(level=logging.WARNING, format="  log: %(message)s", stream=sys.stdout)
    attempts = args.max_attempts if args.max_attempts is not None else "default"
    print(
        f"{args.prompts} prompts, seed {args.seed}, max_attempts {attempts}, timeout {args.timeout} s"
    )
    print("| faults | correct | [ERROR] | requests | duplicate POSTs | wall |")
    print("| --- | --- | --- | --- | --- | --- |")
    for rate in args.rates:
        row = run_one(args.prompts, rate, args.seed, args.max_attempts, args.timeout)
        print(
            f"| {rate:.0%} | {row['correct']} | {row['errors']} | {row['requests']} | "
            f"{row['duplicates']} | {row['wall']:.1f} s |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
