"""The ray executor's long-lived completion workers: reused across batches, several
completions per process, slots kept by a worker yet the cluster-wide limit held, and a
batch left early stopping its workers. A real local Ray cluster, a fake server over HTTP."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

from rlm_graph import run_batch
from rlm_graph.testing import last_user_message
from tests.support.batch import BatchServer, expected, is_root_turn, items, rlm_kwargs

pytestmark = pytest.mark.ray


def _pids(server: BatchServer, since: int = 0) -> set[int]:
    """The worker processes that sent the sub-calls the server got from request ``since`` on."""
    found = set()
    for body in server.bodies[since:]:
        if not is_root_turn(body):
            match = re.search(r"pid=(\d+)", last_user_message(body))
            if match:
                found.add(int(match.group(1)))
    return found


def test_consecutive_batches_run_in_the_same_worker_processes(ray_cluster: Any) -> None:
    with BatchServer(latency=0.01) as server:
        first = list(run_batch(items(8), rlm_kwargs(server), concurrency=4, executor="ray"))
        first_pids, seen = _pids(server), len(server.bodies)
        second = list(run_batch(items(8), rlm_kwargs(server), concurrency=4, executor="ray"))
    assert all(r.ok and r.answer == expected(r.id) for r in first + second)
    # One worker per CPU of the 2-CPU cluster, each running several of the 4 completions;
    # the second batch found them alive and used them again.
    assert len(first_pids) == 2
    assert _pids(server, since=seen) == first_pids


def test_workers_that_keep_slots_never_pass_the_cluster_wide_limit(ray_cluster: Any) -> None:
    # Two workers, six completions at once, one provider slot in the whole cluster: a
    # worker keeping its released slot would starve the other unless the actor recalls it.
    with BatchServer(latency=0.01) as server:
        results = list(
            run_batch(
                items(24), rlm_kwargs(server, max_concurrent=1), concurrency=6, executor="ray"
            )
        )
    assert sorted(r.id for r in results) == sorted(f"item-{i}" for i in range(24))
    assert all(r.ok and r.answer == expected(r.id) for r in results)
    assert len(_pids(server)) == 2
    assert server.peak_in_flight == 1


def test_a_batch_left_early_stops_its_workers_and_the_next_batch_runs(ray_cluster: Any) -> None:
    with BatchServer(latency=0.05) as server:
        stream = run_batch(items(10), rlm_kwargs(server), concurrency=4, executor="ray")
        first = next(iter(stream))
        stream.close()  # the caller stops reading while completions still run
        before, seen = _pids(server), len(server.bodies)
        results = list(run_batch(items(4), rlm_kwargs(server), concurrency=4, executor="ray"))
    assert first.ok and first.answer == expected(first.id)
    assert all(r.ok and r.answer == expected(r.id) for r in results)
    assert (
        before and not _pids(server, since=seen) & before
    )  # new worker processes: the old ones were stopped


def test_a_batch_of_fewer_items_than_its_concurrency_gets_threads_for_its_items(
    ray_cluster: Any,
) -> None:
    # A worker has a thread for each completion it may run at once (Ray starts them
    # with it): --concurrency 2000 for 3 items made workers of over 1,000 threads each.
    with BatchServer() as server:
        results = list(run_batch(items(3), rlm_kwargs(server), concurrency=2000, executor="ray"))
        workers = _pids(server)
    assert all(r.ok and r.answer == expected(r.id) for r in results)
    # The workers serve the driver's next batch: alive, their threads still there.
    threads = {pid: len(os.listdir(f"/proc/{pid}/task")) for pid in workers}
    assert workers and all(count < 200 for count in threads.values()), threads
