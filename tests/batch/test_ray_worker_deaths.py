"""An item that kills its Ray worker, and its neighbours on that worker: a real local Ray
cluster, a fake OpenAI server over real HTTP, model code (the ``local`` environment,
which runs in the worker process) that SIGKILLs the worker for real."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rlm_graph import run_batch
from tests.support.batch import ROOT_CODE, BatchServer, expected, is_root_turn, items, rlm_kwargs

pytestmark = pytest.mark.ray

POISON = "KILLS-ITS-WORKER"

# Kills the worker process it runs in (the local environment runs it there).
KILL_CODE = """
import os, signal, time
time.sleep(0.3)
os.kill(os.getpid(), signal.SIGKILL)
"""

# The other items are still running when their neighbour kills the worker.
SLOW_CODE = "import time\ntime.sleep(1.5)\n" + ROOT_CODE


class PoisonServer(BatchServer):
    """Root turns of an item whose question says `POISON` get `KILL_CODE`, every other
    item's `SLOW_CODE`."""

    def _respond(self, body: dict[str, Any]) -> Any:
        if is_root_turn(body):
            super()._respond(body)  # counted
            code = KILL_CODE if POISON in json.dumps(body) else SLOW_CODE
            return f"```repl\n{code}\n```"
        return super()._respond(body)


def test_an_item_that_kills_its_worker_fails_alone_and_its_neighbour_answers(
    ray_cluster: Any,
) -> None:
    batch = items(5)
    batch[0]["query"] += f" {POISON}"
    with PoisonServer() as server:
        kwargs = {**rlm_kwargs(server, max_concurrent=8), "environment": "local"}
        # Two workers of two (2 CPUs): item-0 and item-2 go to the first, item-1 and
        # item-3 to the second.
        results = {
            r.id: r
            for r in run_batch(
                batch,
                kwargs,
                concurrency=4,
                executor="ray",
                executor_kwargs={"max_retries": 1},
            )
        }
    poison = results.pop("item-0")
    for result in results.values():
        assert result.ok and result.answer == expected(result.id), (result.id, result.error)
    assert poison.error is not None and "died" in poison.error.message.lower(), poison.error
    # Its first death was shared with item-2 (counted for neither); then it ran alone,
    # and died alone twice: max_retries=1 used up by itself.
    assert poison.attempts == 3 and server.root_turns["item-0"] == 3
    # The neighbour ran again, alone, once: the worker it shared died under it.
    assert results["item-2"].attempts == 2 and server.root_turns["item-2"] == 2
    assert results["item-1"].attempts == 1 and results["item-3"].attempts == 1
