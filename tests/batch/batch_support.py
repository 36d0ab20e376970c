"""Shared pieces of the batch tests: items whose answers depend on the item, a fake
server that answers them (and fails the items asked to fail), and their RLM keywords."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from typing import Any

from rlm_graph.testing import FakeOpenAIServer, Reply, last_user_message

KEY = "sk-batch-planted-5678"
FAIL = "PLEASE-FAIL"

# The root model's code: two sub-calls over the item's own context; the answer joins them,
# so every item's answer is its own. The pid in the prompt tells a test which process asked.
ROOT_CODE = """
import os
parts = llm_query_batched([f"{context}-a pid={os.getpid()}", f"{context}-b pid={os.getpid()}"])
answer["content"] = "|".join(p.split(" pid=")[0] for p in parts)
answer["ready"] = True
"""


def items(n: int, *, fail: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    return [
        {"id": f"item-{i}", "context": f"ctx{i}", "query": f"question item-no-{i}." + (f" {FAIL}" if i in fail else "")}
        for i in range(n)
    ]


def expected(item_id: str) -> str:
    n = item_id.split("-")[1]
    return f"sub:ctx{n}-a|sub:ctx{n}-b"


def is_root_turn(body: dict[str, Any]) -> bool:
    return any(m.get("role") == "system" for m in body.get("messages", []))


def question_of(body: dict[str, Any]) -> str | None:
    """The item number a root turn is for (its question is in a user message)."""
    found = re.search(r"item-no-(\d+)\.", json.dumps(body))
    return found.group(1) if found else None


class BatchServer(FakeOpenAIServer):
    """A fake OpenAI server for batches: root turns get `ROOT_CODE`, sub-calls
    ``sub:<prompt>``; a root turn whose question says `FAIL` gets a 400. Counts root
    turns per item."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(self._respond, **kwargs)
        self.root_turns: Counter[str] = Counter()
        self._count_lock = threading.Lock()

    def _respond(self, body: dict[str, Any]) -> Any:
        if is_root_turn(body):
            number = question_of(body)
            with self._count_lock:
                self.root_turns[f"item-{number}"] += 1
            if FAIL in json.dumps(body):
                return Reply.error(400, "this item's request is refused")
            return f"```repl\n{ROOT_CODE}\n```"
        return "sub:" + last_user_message(body)


def rlm_kwargs(server: Any, max_concurrent: int = 3) -> dict[str, Any]:
    return {
        "backend": "openai",
        "backend_kwargs": {
            "model_name": "gpt-test",
            "base_url": server.base_url,
            "api_key": KEY,
            "max_concurrent": max_concurrent,
            "backoff_base": 0.001,
            "timeout": 10.0,
        },
    }
