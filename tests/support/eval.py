"""Shared pieces of the evaluation tests: a tiny data set of every answer type, and a fake
OpenAI server that answers it as an oracle, or with one constant answer per type, the way
each method asks (root turns get REPL code, plain calls get text)."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from typing import Any

from rlm_graph.testing import FakeOpenAIServer, Reply, last_user_message

KEY = "sk-eval-planted-2468"
FAIL = "PLEASE-FAIL"
MODEL = "gpt-5-mini"  # in the price table: costs are known

ITEMS: list[dict[str, Any]] = [
    {"id": "n1", "answer": 3, "answer_type": "numeric"},
    {"id": "n2", "answer": 5, "answer_type": "numeric"},
    {"id": "n3", "answer": 7, "answer_type": "numeric"},
    {"id": "p1", "answer": [[1, 2], [1, 3], [2, 3]], "answer_type": "pairs"},
    {"id": "e1", "answer": "4821337", "answer_type": "exact"},
    {"id": "c1", "answer": "B", "answer_type": "choice"},
]

ORACLE = {
    "n1": "Answer: 3",
    "n2": "Answer: 5",
    "n3": "Answer: 7",
    "p1": "[[1, 2], [1, 3], [2, 3]]",
    "e1": "4821337",
    "c1": "The correct answer is (B)",
}
CONSTANT = {
    "numeric": "Answer: 3",
    "pairs": "[[2, 1], [2, 4]]",
    "exact": "1234567",
    "choice": "The correct answer is (A)",
}
# What the constant answers score, by hand: 0.75 ** |y - 3| and F1 = 2 * (1/2 * 1/3) / (1/2 + 1/3).
CONSTANT_SCORES = {"n1": 1.0, "n2": 0.75**2, "n3": 0.75**4, "p1": 0.4, "e1": 0.0, "c1": 0.0}


def items(
    *, fail: tuple[str, ...] = (), context: str = "the context of {id}"
) -> list[dict[str, Any]]:
    """The data set; an item in ``fail`` gets the marker that makes the server refuse it."""
    return [
        {
            **item,
            "question": f"[item:{item['id']}] What is asked?"
            + (f" {FAIL}" if item["id"] in fail else ""),
            "context": context.format(id=item["id"]),
        }
        for item in ITEMS
    ]


def is_root_turn(body: dict[str, Any]) -> bool:
    return any(m.get("role") == "system" for m in body.get("messages", []))


class EvalServer(FakeOpenAIServer):
    """An oracle (``constant=False``) or a constant model for `ITEMS`.

    Root turns get one REPL block setting ``answer``; the summary agent's note-taking
    steps get notes; plain calls get the answer as text. A request for an item marked
    `FAIL` gets a 400. ``root_code`` replaces the root turn's code (a probe); with
    ``turns`` > 1 the root model looks at the context in the turns before the last.
    """

    def __init__(
        self, *, constant: bool = False, root_code: str | None = None, turns: int = 1, **kwargs: Any
    ) -> None:
        super().__init__(self._respond, **kwargs)
        self.constant = constant
        self.root_code = root_code
        self.turns = turns
        self.asked: Counter[str] = Counter()
        self._lock = threading.Lock()

    def reply_for(self, item_id: str) -> str:
        if not self.constant:
            return ORACLE[item_id]
        kind = next(i["answer_type"] for i in ITEMS if i["id"] == item_id)
        return CONSTANT[kind]

    def _respond(self, body: dict[str, Any]) -> Any:
        text = json.dumps(body)
        found = re.search(r"\[item:(\w+)\]", text)
        item_id = found.group(1) if found else "?"
        with self._lock:
            self.asked[item_id] += 1
        if FAIL in text:
            return Reply.error(400, "this item's request is refused")
        if is_root_turn(body):
            turn = 1 + sum(1 for m in body["messages"] if m.get("role") == "assistant")
            if turn < self.turns:
                return "```repl\nprint(context[:20])\n```"
            code = (
                self.root_code
                or f"answer['content'] = {self.reply_for(item_id)!r}\nanswer['ready'] = True"
            )
            return f"```repl\n{code}\n```"
        if "Rewrite your notes" in last_user_message(body):
            return f"notes on [item:{item_id}]"
        return self.reply_for(item_id)


def rlm_kwargs(server: FakeOpenAIServer, **extra: Any) -> dict[str, Any]:
    backend = {
        "model_name": MODEL,
        "base_url": server.base_url,
        "api_key": KEY,
        "max_concurrent": 4,
        "backoff_base": 0.001,
        "timeout": 10.0,
    }
    return {"backend": "openai", "backend_kwargs": backend, "environment": "local", **extra}
