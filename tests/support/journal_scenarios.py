"""Runs the crash tests kill and resume: each in a process of its own, against a fake
OpenAI server in the test's process.

Run as ``python -m tests.journal.scenarios MODE BASE_URL JOURNAL OUT``: runs scenario
MODE (``flat``, ``depth2``, ``workflow``) over the journal and writes the answer and
``result.replay`` to OUT as JSON. The server plays the models with `respond`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rlm_graph import RLM, Engine, NodeKind, Workflow
from rlm_graph.testing import last_user_message

BATCH = 200
CHILDREN = 8
PER_CHILD = 25

FLAT_ROOT = f"parts = llm_query_batched([f'q{{i}}' for i in range({BATCH})])"
DEPTH2_ROOT = f"parts = rlm_query_batched([f'doc{{i}}' for i in range({CHILDREN})])"
CHILD = f"parts = llm_query_batched([context + f'/q{{j}}' for j in range({PER_CHILD})])"
COUNTED = {
    NodeKind.ROOT_TURN,
    NodeKind.LLM_CALL,
    NodeKind.RLM_CALL,
    NodeKind.COMPACTION,
    NodeKind.FUNCTION,
}


def repl(code: str) -> str:
    return f"```repl\n{code}\n```"


def is_turn(body: dict[str, Any]) -> bool:
    return any(m.get("role") == "system" for m in body["messages"])


def respond(body: dict[str, Any]) -> str:
    """Root turns write code (a batch of plain sub-calls, or of children when the root may
    recurse); a child (no question in its first message) runs a batch of its own; plain
    sub-calls answer ``a:<prompt>``."""
    if not is_turn(body):
        return "a:" + last_user_message(body)
    messages = body["messages"]
    child = "Question:" not in messages[1]["content"]
    recursive = "fall back to a plain" not in messages[0]["content"]
    if not any(m.get("role") == "assistant" for m in messages):
        return repl(CHILD if child else DEPTH2_ROOT if recursive else FLAT_ROOT)
    return repl("FINAL(context + '=' + '|'.join(parts))" if child else "FINAL('|'.join(parts))")


def rlm(base_url: str, journal: str | None, mode: str) -> RLM:
    return RLM(
        "openai",
        {
            "model_name": "m",
            "base_url": base_url,
            "api_key": "sk-test",
            "max_concurrent": 16,
            "timeout": 30.0,
        },
        max_depth=2 if mode == "depth2" else 1,
        batch_max_concurrent=16,
        journal=journal,
    )


def workflow() -> Workflow:
    wf = Workflow()
    maps = [wf.llm(f"w{i}") for i in range(BATCH)]
    joined = wf.function(lambda *parts: "|".join(parts), *maps, id="reduce")
    wf.llm(lambda text: f"final {len(text)}", joined, id="final")
    return wf


def run(mode: str, base_url: str, journal: str | None) -> dict[str, Any]:
    """Run scenario ``mode``; the answer, the replay summary, and the counted nodes."""
    if mode == "workflow":
        engine = Engine(
            "openai",
            {"model_name": "m", "base_url": base_url, "api_key": "sk-test", "max_concurrent": 16},
        )
        result = engine.run(workflow(), journal=journal)
        answer = f"{result['reduce']}#{result['final']}"
        graph, replay = result.graph, result.replay
    else:
        done = rlm(base_url, journal, mode).completion(
            "crash-" + mode, root_prompt="join the answers"
        )
        answer, graph, replay = done.response, done.graph, done.replay
    return {
        "answer": answer,
        "replay": replay.model_dump() if replay is not None else None,
        "counted": sum(1 for r in graph.records() if r.kind in COUNTED),
        "live_model_calls": sum(
            1
            for r in graph.records()
            if r.kind in (NodeKind.ROOT_TURN, NodeKind.LLM_CALL, NodeKind.COMPACTION)
            and not r.replayed
        ),
    }


if __name__ == "__main__":
    mode, base_url, journal, out = sys.argv[1:5]
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(run(mode, base_url, journal), handle)
