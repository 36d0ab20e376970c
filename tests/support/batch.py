"""Shared pieces of the batch tests: items whose answers depend on the item, a fake
server that answers them (and fails the items asked to fail), and their RLM keywords."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
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
        {
            "id": f"item-{i}",
            "context": f"ctx{i}",
            "query": f"question item-no-{i}." + (f" {FAIL}" if i in fail else ""),
        }
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


# -- the rlm-graph batch command --------------------------------------------------------


def write_items(path: Path, batch: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(item) + "\n" for item in batch))


def cli_args(server: BatchServer, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "batch",
        "--input",
        str(tmp_path / "in.jsonl"),
        "--output",
        str(tmp_path / "out.jsonl"),
        "--model",
        "gpt-test",
        "--base-url",
        server.base_url,
        "--api-key-env",
        "OPENAI_API_KEY",
        "--max-concurrent",
        "3",
        *extra,
    ]


def local_cli_args(server: BatchServer, tmp_path: Path, *extra: str) -> list[str]:
    """As `cli_args`, with the local environment: the tests that run many items stay fast."""
    return cli_args(server, tmp_path, "--environment", "local", *extra)


def read_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def start_cli(server: BatchServer, tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    args = local_cli_args(server, tmp_path, *extra)
    # A killed run cannot remove its completions' scratch folders: keep them in tmp_path.
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    env = {**os.environ, "OPENAI_API_KEY": KEY, "TMPDIR": str(scratch)}
    return subprocess.Popen(
        [sys.executable, "-m", "rlm_graph.cli", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for_lines(path: Path, count: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_text().count("\n") >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"the batch never wrote {count} lines (exit {proc.poll()})")


def kill_and_resume(
    server: BatchServer, tmp_path: Path, n: int, *extra: str
) -> list[dict[str, object]]:
    """Start the CLI, SIGKILL it once some items are written, rerun it to the end; return
    the output lines. Checks that the rerun never asked again for an item already written."""
    write_items(tmp_path / "in.jsonl", items(n))
    out = tmp_path / "out.jsonl"
    first = start_cli(server, tmp_path, *extra)
    try:
        wait_for_lines(out, n // 4, first)
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    assert first.returncode == -signal.SIGKILL
    written = {line["id"] for line in read_lines(out)}
    assert 0 < len(written) < n, "kill the run midway"
    asked_before = dict(server.root_turns)
    second = start_cli(server, tmp_path, *extra)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert f"{len(written)} of {n} items already in" in err
    for item_id in written:
        assert server.root_turns[item_id] == asked_before[item_id]  # not asked again
    return read_lines(out)
