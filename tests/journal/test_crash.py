"""SIGKILL a real process mid-run, resume in a new one: nothing journaled is asked again.

The fake OpenAI server runs in the test's process and outlives the killed run. It holds
every sub-call past the first ``hold_after`` until the kill, so the run is cut at a
known point; the test kills only once every answered sub-call is in the journal.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rlm_graph.errors import ConfigError
from rlm_graph.journal import JournalStore
from rlm_graph.testing import FakeOpenAIServer, last_user_message
from tests.support import journal_scenarios as scenarios

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def _child(mode: str, base_url: str, journal: Path, out: Path) -> subprocess.Popen[bytes]:
    with out.with_suffix(".err").open("wb") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.journal_scenarios",
                mode,
                base_url,
                str(journal),
                str(out),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _stderr(out: Path) -> str:
    return out.with_suffix(".err").read_text(errors="replace")[-2000:]


def _journaled(journal: Path) -> dict[str, tuple[str, str]]:
    """Journaled nodes of every run in the file: id -> (kind, input preview)."""
    if not journal.exists():
        return {}
    try:
        store = JournalStore(journal)
    except ConfigError:  # the writer is still making the file
        return {}
    try:
        found = {}
        for run in store.runs():
            for node in store.load(run.key).values():
                found[node.id] = (node.record.kind.value, node.record.input_preview)
        return found
    finally:
        store.close()


def _wait_for(condition: Any, process: subprocess.Popen[bytes], out: Path, what: str) -> None:
    deadline = time.monotonic() + 120  # a safety net, not a measurement
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {_stderr(out)}")
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def _sub_prompts(server: FakeOpenAIServer) -> Counter[str]:
    return Counter(
        last_user_message(r.body) for r in list(server.requests) if not scenarios.is_turn(r.body)
    )


@pytest.mark.parametrize(
    ("mode", "hold_after", "children_done"),
    [("flat", 120, 0), ("depth2", 130, 1), ("workflow", 120, 0)],
)
def test_sigkill_mid_run_then_resume_asks_nothing_twice(
    tmp_path: Path, mode: str, hold_after: int, children_done: int
) -> None:
    with FakeOpenAIServer(scenarios.respond) as clean:
        expected = scenarios.run(mode, clean.base_url, None)["answer"]

    hold = threading.Event()
    lock = threading.Lock()
    answered = [0]

    def respond(body: dict[str, Any]) -> str:
        if not scenarios.is_turn(body):
            with lock:
                answered[0] += 1
                late = answered[0] > hold_after
            if late:
                hold.wait()  # in flight when the process dies
        return scenarios.respond(body)

    journal = tmp_path / "run.sqlite"
    with FakeOpenAIServer(respond) as server:
        try:
            first = _child(mode, server.base_url, journal, tmp_path / "first.json")

            def all_answers_journaled() -> bool:
                kinds = Counter(kind for kind, _ in _journaled(journal).values())
                return kinds["llm_call"] >= hold_after and kinds["rlm_call"] >= children_done

            _wait_for(
                all_answers_journaled,
                first,
                tmp_path / "first.json",
                "the answered sub-calls were journaled",
            )
            first.send_signal(signal.SIGKILL)
            first.wait()
        finally:
            hold.set()
        assert first.returncode == -signal.SIGKILL
        journaled = _journaled(journal)
        # The crashed run can still be looked at: listed as running, its graph exportable.
        store = JournalStore(journal)
        try:
            (crashed,) = store.runs()
            graph = store.graph(crashed.key)
        finally:
            store.close()
        assert crashed.status == "running" and crashed.attempts == 1
        assert sorted(r.id for r in graph.records()) == sorted(journaled)
        sub_calls = {text for kind, text in journaled.values() if kind == "llm_call"}
        assert len(sub_calls) >= 100  # at least half of the 200 was answered and kept
        before = len(server.requests)

        second = _child(mode, server.base_url, journal, tmp_path / "second.json")
        second.wait(timeout=300)
        assert second.returncode == 0, _stderr(tmp_path / "second.json")
        resumed = json.loads((tmp_path / "second.json").read_text())
        asked = Counter(
            last_user_message(r.body)
            for r in server.requests[before:]
            if not scenarios.is_turn(r.body)
        )
        total = _sub_prompts(server)
        during_resume = len(server.requests) - before

    assert resumed["answer"] == expected
    assert not set(asked) & sub_calls, "a journaled prompt was asked again"
    assert all(total[prompt] == 1 for prompt in sub_calls)
    replay = resumed["replay"]
    assert replay["attempt"] == 2 and replay["diverged"] == 0
    assert replay["replayed"] + replay["live"] + replay["diverged"] == resumed["counted"]
    counted_kinds = {"root_turn", "llm_call", "rlm_call", "compaction", "function"}
    assert replay["replayed"] == sum(1 for kind, _ in journaled.values() if kind in counted_kinds)
    assert during_resume == resumed["live_model_calls"] > 0
    db = sqlite3.connect(journal)
    try:
        store_status = db.execute("SELECT status, attempts FROM runs").fetchall()
    finally:
        db.close()
    assert store_status == [("finished", 2)]
