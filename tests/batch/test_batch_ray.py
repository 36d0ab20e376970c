"""Batches on the ray executor: a real local Ray cluster (one for the session), a fake
OpenAI server over real HTTP, worker processes killed for real."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from rlm_graph import run_batch
from rlm_graph.errors import ConfigError
from rlm_graph.journal import JournalStore
from rlm_graph.testing import last_user_message
from tests.support.batch import (
    KEY,
    BatchServer,
    expected,
    is_root_turn,
    items,
    kill_and_resume,
    local_cli_args,
    read_lines,
    rlm_kwargs,
    wait_for_lines,
    write_items,
)
from tests.support.terminal import as_from_a_terminal

pytestmark = pytest.mark.ray


def _pids(server: BatchServer) -> set[int]:
    found = set()
    for body in server.bodies:
        if not is_root_turn(body):
            match = re.search(r"pid=(\d+)", last_user_message(body))
            if match:
                found.add(int(match.group(1)))
    return found


def test_forty_items_on_ray_hold_the_provider_limit_across_the_cluster(ray_cluster: Any) -> None:
    with BatchServer(latency=0.02) as server:
        results = list(
            run_batch(
                items(40), rlm_kwargs(server, max_concurrent=2), concurrency=4, executor="ray"
            )
        )
    assert sorted(r.id for r in results) == sorted(f"item-{i}" for i in range(40))
    assert all(r.ok and r.answer == expected(r.id) and r.executor == "ray" for r in results)
    # Several worker processes called the provider at once; together, never more than 2.
    assert len(_pids(server)) > 1 and os.getpid() not in _pids(server)
    assert 1 < server.peak_in_flight <= 2


def test_an_item_whose_provider_fails_on_ray_is_recorded_and_the_others_finish(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The key is in the driver's environment only: the workers get it from the driver.
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with BatchServer(api_key=KEY) as server:
        kwargs = rlm_kwargs(server)
        del kwargs["backend_kwargs"]["api_key"]
        # The fake server is not OpenAI's host: say that the environment's key goes there.
        kwargs["backend_kwargs"]["api_key_env"] = "OPENAI_API_KEY"
        results = {
            r.id: r for r in run_batch(items(6, fail=(1,)), kwargs, concurrency=3, executor="ray")
        }
    failed = results.pop("item-1")
    assert failed.error is not None and "refused" in failed.error.message  # not a 401
    assert KEY not in failed.error.message
    assert all(r.ok and r.answer == expected(r.id) for r in results.values())


class KillingServer(BatchServer):
    """SIGKILLs the worker process behind the first sub-call of ``victim``."""

    def __init__(self, victim: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.victim = victim
        self.killed: list[int] = []
        self._kill_lock = threading.Lock()

    def _respond(self, body: dict[str, Any]) -> Any:
        prompt = last_user_message(body)
        if not is_root_turn(body) and prompt.startswith(self.victim + "-"):
            pid = int(prompt.rsplit("pid=", 1)[1])
            with self._kill_lock:
                if not self.killed:
                    self.killed.append(pid)
                    os.kill(pid, signal.SIGKILL)
        return super()._respond(body)


def test_a_worker_killed_mid_task_is_retried_and_frees_its_provider_slot(ray_cluster: Any) -> None:
    # max_concurrent=1: had the dead worker kept its slot, nothing could call the provider again.
    with KillingServer("ctx3") as server:
        results = {
            r.id: r
            for r in run_batch(
                items(8), rlm_kwargs(server, max_concurrent=1), concurrency=3, executor="ray"
            )
        }
    assert len(server.killed) == 1
    assert sorted(results) == sorted(f"item-{i}" for i in range(8))
    assert all(r.ok and r.answer == expected(r.id) for r in results.values())
    assert results["item-3"].attempts == 2 and server.root_turns["item-3"] == 2
    assert server.peak_in_flight == 1
    # The killed worker's scratch folder (its context in it) was removed by the driver.
    assert _folders_of(server.killed) == []


def _folders_of(pids: Any) -> list[str]:
    marks = tuple(f"rlm-graph-{pid}-" for pid in pids)
    return [name for name in os.listdir(tempfile.gettempdir()) if name.startswith(marks)]


def test_a_batch_read_only_partly_leaves_no_folder_of_its_workers(ray_cluster: Any) -> None:
    with BatchServer(latency=0.5) as server:
        batch = run_batch(items(8), rlm_kwargs(server), concurrency=4, executor="ray")
        with closing(batch):
            first = next(iter(batch))
        assert first.ok
    # The workers still running completions were stopped (and killed) when the caller
    # stopped reading: their completions cleaned up first.
    assert len(_pids(server)) >= 1
    assert _folders_of(_pids(server)) == []


def test_a_ray_batch_killed_midway_then_resumed_answers_every_id_exactly_once(
    ray_cluster: Any, tmp_path: Path
) -> None:
    address = ray_cluster.get_runtime_context().gcs_address
    with BatchServer(latency=0.02) as server:
        # Each driver is a Ray job with worker processes of its own: 2 keep the test short.
        lines = kill_and_resume(
            server,
            tmp_path,
            12,
            "--concurrency",
            "2",
            "--executor",
            "ray",
            "--ray-address",
            address,
        )
    assert sorted(line["id"] for line in lines) == sorted(f"item-{i}" for i in range(12))
    assert all(
        line["answer"] == expected(str(line["id"])) and line["executor"] == "ray" for line in lines
    )


class SlowKillingServer(KillingServer):
    """Like `KillingServer`, but kills only once the worker's journal holds the victim's
    finished root turn (the journal commits in batches, so a fixed sleep could lose the
    race on a loaded machine)."""

    def __init__(self, victim: str, journal: Path, question: str, **kwargs: Any) -> None:
        super().__init__(victim, **kwargs)
        self.journal = journal
        self.question = question
        self.waited_for_journal = False

    def _root_turn_journaled(self) -> bool:
        if not self.journal.exists():
            return False
        try:
            store = JournalStore(self.journal, read_only=True)
        except ConfigError:  # not made yet, or its format not written yet
            return False
        try:
            return any(
                self.question in run.label and "turn-1" in store.load(run.key)
                for run in store.runs()
            )
        finally:
            store.close()

    def _respond(self, body: dict[str, Any]) -> Any:
        prompt = last_user_message(body)
        if not is_root_turn(body) and prompt.startswith(self.victim + "-") and not self.killed:
            for _ in range(600):  # at most 30 s; the kill and the assertions follow either way
                if self._root_turn_journaled():
                    self.waited_for_journal = True
                    break
                time.sleep(0.05)
        return super()._respond(body)


def test_with_a_journal_the_retried_completion_does_not_pay_again_for_its_root_turn(
    ray_cluster: Any, tmp_path: Path
) -> None:
    journal = tmp_path / "batch.sqlite"
    with SlowKillingServer("ctx2", journal, "item-no-2.") as server:
        kwargs = {**rlm_kwargs(server, max_concurrent=2), "journal": str(journal)}
        results = {r.id: r for r in run_batch(items(4), kwargs, concurrency=2, executor="ray")}
    assert len(server.killed) == 1
    assert server.waited_for_journal, "the kill came before the root turn was journaled"
    assert all(r.ok and r.answer == expected(r.id) for r in results.values()), [
        (r.id, r.ok, r.answer, r.error, r.attempts) for r in results.values()
    ]
    assert results["item-2"].attempts == 2
    # The retry replayed the root turn from the journal: the model was asked once.
    assert server.root_turns["item-2"] == 1


def test_a_batch_after_the_limits_actor_died_starts_a_new_one(ray_cluster: Any) -> None:
    from rlm_graph_ray.executor import _ACTORS

    with BatchServer() as server:
        list(run_batch(items(2), rlm_kwargs(server), concurrency=2, executor="ray"))
        for actor in _ACTORS.values():
            ray_cluster.kill(actor)
        results = list(run_batch(items(3), rlm_kwargs(server), concurrency=2, executor="ray"))
    assert all(r.ok and r.answer == expected(r.id) for r in results)


class HoldingServer(BatchServer):
    """Holds every root turn whose question says HOLD until `release` is set; counts them."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.release = threading.Event()
        self.held = 0

    def _respond(self, body: dict[str, Any]) -> Any:
        if is_root_turn(body) and "HOLD" in str(body):
            with self._count_lock:
                self.held += 1
            self.release.wait(60)
        return super()._respond(body)


def test_a_batch_stopped_early_leaves_another_batch_of_the_driver_running(
    ray_cluster: Any,
) -> None:
    held = [dict(item, query=item["query"] + " HOLD") for item in items(4)]
    results_b: list[Any] = []
    with HoldingServer() as server:
        try:
            b = run_batch(held, rlm_kwargs(server, max_concurrent=8), concurrency=4, executor="ray")
            reader = threading.Thread(target=lambda: results_b.extend(b))
            reader.start()
            deadline = time.monotonic() + 60
            while server.held < 4 and time.monotonic() < deadline:  # B's 4 calls are running
                time.sleep(0.01)
            assert server.held == 4
            # A second batch on the same pool (same shape), left after its first result
            # while its other items still run.
            with closing(
                run_batch(
                    items(3), rlm_kwargs(server, max_concurrent=8), concurrency=4, executor="ray"
                )
            ) as a:
                assert next(iter(a)).ok
        finally:
            server.release.set()
        reader.join(120)
    assert sorted(r.id for r in results_b) == [f"item-{i}" for i in range(4)]
    for result in results_b:  # not killed with A's stop: answered at their first attempt
        assert result.ok and result.answer == expected(result.id), result.error
        assert result.attempts == 1


def test_a_batch_of_another_shape_runs_while_the_first_is_open(ray_cluster: Any) -> None:
    """A second batch of another concurrency, while a first one's pool held all of the
    cluster's CPUs (8 at once: two workers of one CPU each), waited for new workers that
    could not start (forever, read from the same thread): it shares the pool in use."""
    got: list[Any] = []
    with (
        BatchServer() as server,
        closing(
            run_batch(
                items(12), rlm_kwargs(server, max_concurrent=16), concurrency=8, executor="ray"
            )
        ) as first,
    ):
        assert next(iter(first)).ok
        with closing(
            run_batch(
                items(2), rlm_kwargs(server, max_concurrent=16), concurrency=2, executor="ray"
            )
        ) as second:
            reader = threading.Thread(target=lambda: got.extend(second), daemon=True)
            reader.start()
            reader.join(90)  # a guard: without the fix it never ends
    assert [result.ok for result in got] == [True, True]


def test_an_error_raised_in_the_worker_is_its_own_in_the_row(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The key is in the driver's environment only, and not sent: the worker's engine refuses.
    monkeypatch.setenv("ONLY_IN_THE_DRIVER_API_KEY", KEY)
    with BatchServer() as server:
        kwargs = rlm_kwargs(server)
        del kwargs["backend_kwargs"]["api_key"]
        kwargs["backend_kwargs"]["api_key_env"] = "ONLY_IN_THE_DRIVER_API_KEY"
        (result,) = run_batch(
            items(1), kwargs, concurrency=2, executor="ray", executor_kwargs={"forward_keys": False}
        )
        assert server.requests == []
    assert result.error is not None and result.error.type == "ConfigError"
    assert "$ONLY_IN_THE_DRIVER_API_KEY is not set" in result.error.message
    assert "\x1b" not in result.error.message and "ray::" not in result.error.message


@pytest.mark.processes
@pytest.mark.parametrize("address", ["auto", None], ids=["auto", "no-address"])
def test_a_cluster_recorded_by_a_ray_start_that_is_gone_does_not_hang_the_batch(
    tmp_path: Path, address: str | None
) -> None:
    """A ``ray start --head`` killed, not stopped, leaves its address in Ray's
    ``ray_current_cluster``: ``ray.init`` then joined it for ``auto`` and for no address
    alike, and waited for ever, deaf to Ctrl-C. ``auto`` is refused (exit 2, nothing
    written); with no address a local Ray starts in its place."""
    write_items(tmp_path / "in.jsonl", items(2))
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # Ray's sockets: short paths
    try:
        (ray_tmp / "ray").mkdir()
        with socket.socket() as closed:  # a port of this machine that nothing listens on
            closed.bind(("127.0.0.1", 0))
            gone = f"127.0.0.1:{closed.getsockname()[1]}"
        (ray_tmp / "ray" / "ray_current_cluster").write_text(gone)
        with BatchServer() as server:
            args = local_cli_args(server, tmp_path, "--executor", "ray", "--quiet")
            args += ["--ray-address", address] if address else []
            done = subprocess.run(
                [sys.executable, "-m", "rlm_graph.cli", *args],
                env={**os.environ, "OPENAI_API_KEY": KEY, "RAY_TMPDIR": str(ray_tmp)},
                capture_output=True,
                text=True,
                timeout=180,
            )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    said = f"cannot reach the Ray cluster at '{gone}', recorded by an earlier `ray start`"
    assert said in done.stderr, done.stderr
    if address == "auto":
        assert done.returncode == 2 and not (tmp_path / "out.jsonl").exists()
        assert "leave out --ray-address for a local Ray" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert "starting a local Ray instead" in done.stderr
        answers = {line["id"]: line["answer"] for line in read_lines(tmp_path / "out.jsonl")}
        assert answers == {f"item-{n}": expected(f"item-{n}") for n in range(2)}


def test_a_ray_address_nothing_answers_is_refused_before_the_output_is_made(
    tmp_path: Path,
) -> None:
    write_items(tmp_path / "in.jsonl", items(1))
    with socket.socket() as closed:  # a port of this machine that nothing listens on
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    args = ["batch", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.jsonl")]
    done = subprocess.run(
        [sys.executable, "-m", "rlm_graph.cli", *args, "--model", "m", "--executor", "ray"]
        + ["--ray-address", address],
        env={**os.environ, "OPENAI_API_KEY": KEY},
        capture_output=True,
        text=True,
        timeout=120,  # without its own check, ray.init waited minutes on such an address
    )
    assert done.returncode == 2, done.stderr
    assert f"cannot reach the Ray cluster at '{address}'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.processes
@pytest.mark.parametrize(
    ("stop", "code"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
    ids=["Ctrl-C", "SIGTERM", "SIGHUP"],
)
def test_a_stop_of_a_ray_batch_ends_on_its_own_message(
    ray_cluster: Any, tmp_path: Path, stop: signal.Signals, code: int
) -> None:
    """Ctrl-C (to the whole group, as on a terminal) or `kill` (the process alone) of a
    Ray batch: the command's own stop (docs/cli.md), not Ray's. ``ray.init`` put in its
    own SIGTERM handler, an exit on the spot (1, or 134 with its crash dump)."""
    write_items(tmp_path / "in.jsonl", items(30))
    out = tmp_path / "out.jsonl"
    address = ray_cluster.get_runtime_context().gcs_address
    with BatchServer(latency=0.2) as server:
        # --concurrency 2: this driver's workers need CPUs the test process's pool leaves.
        args = local_cli_args(
            server, tmp_path, "--concurrency", "2", "--executor", "ray", "--ray-address", address
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "rlm_graph.cli", *args],
            env={**os.environ, "OPENAI_API_KEY": KEY},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=as_from_a_terminal(),
        )
        try:
            wait_for_lines(out, 3, process)  # type: ignore[arg-type]
        finally:
            if stop == signal.SIGINT:
                os.killpg(process.pid, stop)
            else:
                process.send_signal(stop)
            _, err = process.communicate(timeout=120)
    assert process.returncode == code, err
    if stop != signal.SIGINT:
        done = len(out.read_text().splitlines())
        said = f"rlm-graph batch: interrupted ({stop.name}) after {done} items; rerun"
        assert said in err, err
    after = err.split("rerun the same command to resume", 1)[1]
    # Not Ray's "Unhandled error" traceback of each call the stop ended, after that line.
    assert after.strip() == "", after
