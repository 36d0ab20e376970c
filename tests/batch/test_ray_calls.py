"""The ray executor's bookkeeping of a batch's calls (`rlm_graph_ray.calls.Calls`) when
a worker dies under two batches that share the driver's pool: which provider places a
dead worker gives back. A stand-in for Ray's handles and errors (the deaths of real
workers are in test_ray_worker_deaths.py): the order in which two batches learn of one
death is what is tested, and real Ray cannot be made to give a chosen order."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from rlm_graph.executors import BatchItem

pytest.importorskip("ray")
from rlm_graph_ray import calls as calls_module  # noqa: E402
from rlm_graph_ray.calls import Calls  # noqa: E402


class _Died(Exception):
    """Ray's error for a call whose actor died."""


_ERRORS = SimpleNamespace(
    RayError=Exception,
    RayActorError=_Died,
    WorkerCrashedError=_Died,
    NodeDiedError=_Died,
    ObjectLostError=_Died,
    OwnerDiedError=_Died,
)


class _Ref:
    """A call's ref: hashable by identity, as Ray's are."""

    def __init__(self, worker: _Worker, item: BatchItem, attempt: int) -> None:
        self.worker, self.item, self.attempt = worker, item, attempt


class _Worker:
    numbers = itertools.count()

    def __init__(self) -> None:
        self.alive, self.number = True, next(self.numbers)
        self.complete = SimpleNamespace(remote=self._call)

    def _call(self, *args: Any) -> _Ref:
        _, item, _, _, attempt, _, _ = args
        return _Ref(self, item, attempt)


class _Ray:
    exceptions = _ERRORS

    def get(self, ref: _Ref | None) -> dict[str, Any] | None:
        if ref is None:  # what the limits actor's release answered
            return None
        if not ref.worker.alive:
            raise _Died("the actor died")
        return {"id": ref.item.id, "answer": "ok", "started_at": 0, "finished_at": 0,
                "seconds": 0, "attempts": ref.attempt}  # fmt: skip

    def kill(self, worker: _Worker) -> None:
        worker.alive = False


def test_a_dead_workers_late_call_gives_back_its_own_places_not_its_replacements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batch 1 replaced the dead worker; batch 2 then ran its item again on the new
    worker under the dead worker's name, and the dead worker's other call of batch 2,
    coming back later, gave back the places the new run held (``max_concurrent`` could
    be passed)."""
    monkeypatch.setattr(calls_module.scratch, "sweep_stale", lambda: [])
    released: list[str] = []
    actor = SimpleNamespace(release_owner=SimpleNamespace(remote=released.append))
    executor = SimpleNamespace(
        _ray=_Ray(), max_retries=3, _new_worker=lambda _: _Worker(), _limits_actor=lambda: actor
    )
    pool: list[Any] = [_Worker()]
    first, second = (Calls(executor, pool, 2, 2, (None, None)) for _ in range(2))  # type: ignore[arg-type]
    first.fill(iter([BatchItem(id=f"a{n}", query="q") for n in range(2)]))
    second.fill(iter([BatchItem(id=f"b{n}", query="q") for n in range(2)]))
    dead = pool[0]
    dead.alive = False
    for ref in list(first.pending):
        assert first.finished(ref) is None  # run again, alone, on the new worker
    assert pool[0] is not dead
    early, late = list(second.pending)
    second.finished(early)
    (rerun,) = [call for call in second.pending.values() if call.worker is pool[0]]
    second.finished(late)
    assert rerun.holder not in released  # the places of the run on the new worker stand
    assert set(released) == {first.holders[dead], second.holders[dead]}
