"""The ``ray`` batch executor: each completion a Ray task running its own trio loop.

The driver (the process that called `run_batch`) keeps at most ``concurrency`` tasks in
flight, reads each item's context before submitting it (workers need not see the
driver's files), and yields each result as its task finishes (``ray.wait``). Provider
limits hold cluster-wide: every task's engine gets a `RayLimiter` that asks the batch's
`ClusterLimits` actor, pinned to the driver's node and shared by the batches of one
driver (each under its own keys).

When a worker process or its node dies, the driver releases the dead attempt's slots in
the actor and submits the item again (up to ``max_retries`` times; the result says how
many attempts it took). Ray's own task retries are off so that this release always
happens first.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from rlm_graph.errors import ConfigError
from rlm_graph.executors import BatchError, BatchItem, BatchResult

from .limits_actor import ClusterLimits, RayLimiter

__all__ = ["RayExecutor", "complete_on_worker"]

INSTALL_HINT = "the ray executor needs Ray: pip install 'rlm-graph[ray]'"

# The limits actor of each Ray job (driver) this process has run batches in.
_ACTORS: dict[str, Any] = {}


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return ray


def complete_on_worker(
    rlm_kwargs: Mapping[str, Any],
    item: BatchItem,
    actor: Any,
    batch: str,
    attempt: int,
    keys: Mapping[str, str],
) -> dict[str, Any]:
    """The body of one Ray task: answer ``item`` in a trio loop of this worker.

    ``keys`` are the driver's ``*_API_KEY`` variables: providers read their keys from
    the environment, and a worker on another node has the environment of its node.
    """
    import trio

    os.environ.update(keys)

    from rlm_graph import RLM
    from rlm_graph.executors import complete_item, frozen_heap

    limiter = RayLimiter(actor, batch=batch, owner=_owner(batch, item, attempt))

    async def answer() -> BatchResult:
        async with RLM(**rlm_kwargs, limiter=limiter) as rlm:
            return await complete_item(rlm, item, executor="ray", attempts=attempt)

    try:
        # A worker process holds Ray's heap too: no full collection walks it mid-task.
        with frozen_heap():
            return trio.run(answer).model_dump(mode="json")
    finally:
        limiter.flush()  # releases the loop had no time to send


class RayExecutor:
    """Run a batch's completions as Ray tasks, with provider limits held cluster-wide.

    Args:
        address: the cluster to join (``"auto"``, ``"ray://head:10001"``); default: the
            one this process is already connected to, else a new local one.
        task_cpus: CPUs Ray reserves per running completion (default 0.25: a completion
            mostly waits on its provider, so a node runs 4 per CPU).
        max_retries: how many times an item is run again after its worker died.
        init_kwargs: more keywords for ``ray.init`` (``runtime_env``...).
        forward_keys: set the driver's ``*_API_KEY`` environment variables in the
            workers' environment (default on; off: the nodes' own environment holds them).

    Raises:
        ConfigError: Ray is not installed (the message says how to install it).
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        task_cpus: float = 0.25,
        max_retries: int = 3,
        init_kwargs: Mapping[str, Any] | None = None,
        forward_keys: bool = True,
    ) -> None:
        self._ray = _import_ray()
        if task_cpus <= 0:
            raise ConfigError("task_cpus must be > 0 (a running completion needs some CPU)")
        if max_retries < 0:
            raise ConfigError("max_retries must be 0 or more")
        self.address = address
        self.task_cpus = task_cpus
        self.max_retries = max_retries
        self.init_kwargs = dict(init_kwargs or {})
        self.forward_keys = forward_keys

    def _connect(self) -> None:
        ray = self._ray
        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=False, **self.init_kwargs)

    def _limits_actor(self) -> Any:
        """This driver's `ClusterLimits` actor, started once and ready before use.

        An actor is a process of its own (a second or two to start), so one serves every
        batch this driver runs; each batch keeps its own gates in it (see `RayLimiter`).
        """
        ray = self._ray
        job = ray.get_runtime_context().get_job_id()
        actor = _ACTORS.get(job)
        if actor is not None:
            try:
                ray.get(actor.statistics.remote())
            except ray.exceptions.RayActorError:  # it died (its node went away): a new one
                actor = None
        if actor is None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here = ray.get_runtime_context().get_node_id()
            # On the driver's node, with no CPU: it lives and dies with the driver.
            actor = ray.remote(ClusterLimits).options(
                num_cpus=0,
                max_concurrency=10_000,
                scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
            ).remote()
            ray.get(actor.statistics.remote())  # started: completions never wait for it
            _ACTORS[job] = actor
        return actor

    def run(
        self, items: Iterator[BatchItem], rlm_kwargs: Mapping[str, Any], *, concurrency: int
    ) -> Iterator[BatchResult]:
        self._connect()
        return self._run(items, dict(rlm_kwargs), concurrency)

    def _run(
        self, items: Iterator[BatchItem], rlm_kwargs: dict[str, Any], concurrency: int
    ) -> Iterator[BatchResult]:
        ray = self._ray
        actor = self._limits_actor()
        batch = uuid.uuid4().hex[:12]
        task = ray.remote(complete_on_worker).options(num_cpus=self.task_cpus, max_retries=0)
        shared_kwargs = ray.put(rlm_kwargs)
        # An argument in the object store, not the job's runtime_env (the dashboard shows it).
        keys = ray.put(_driver_keys() if self.forward_keys else {})
        pending: dict[Any, tuple[BatchItem, int]] = {}

        def submit(item: BatchItem, attempt: int) -> None:
            pending[task.remote(shared_kwargs, item, actor, batch, attempt, keys)] = (item, attempt)

        def fill() -> None:
            while len(pending) < concurrency:
                item = next(items, None)
                if item is None:
                    return
                try:
                    submit(item.loaded(), 1)
                except ConfigError as exc:  # its context file went missing: that item failed
                    pending_error.append(_failed(item, exc, 1))

        pending_error: list[BatchResult] = []
        try:
            fill()
            while pending or pending_error:
                while pending_error:
                    yield pending_error.pop()
                if not pending:
                    fill()
                    continue
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    item, attempt = pending.pop(ref)
                    result = self._outcome(ref, item, attempt, actor, batch, submit)
                    if result is not None:
                        yield result
                fill()
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            actor.forget_batch.remote(batch)

    def _outcome(
        self, ref: Any, item: BatchItem, attempt: int, actor: Any, batch: str, submit: Any
    ) -> BatchResult | None:
        """The result of a finished task; None when its item was submitted again."""
        ray = self._ray
        exceptions = ray.exceptions
        try:
            return BatchResult(**ray.get(ref))
        except (exceptions.WorkerCrashedError, exceptions.NodeDiedError, exceptions.ObjectLostError,
                exceptions.OwnerDiedError) as exc:
            # The worker died mid-completion: free its slots, then run the item again.
            ray.get(actor.release_owner.remote(_owner(batch, item, attempt)))
            if attempt <= self.max_retries:
                submit(item, attempt + 1)
                return None
            return _failed(item, exc, attempt)
        except exceptions.RayError as exc:  # the task itself could not run (a bug, a bad pickle)
            ray.get(actor.release_owner.remote(_owner(batch, item, attempt)))
            return _failed(item, exc, attempt)


def _driver_keys() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name.endswith("_API_KEY") and value}


def _owner(batch: str, item: BatchItem, attempt: int) -> str:
    return f"{batch}/{item.id}#{attempt}"


def _failed(item: BatchItem, exc: BaseException, attempt: int) -> BatchResult:
    now = time.time()
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return BatchResult(
        id=item.id, started_at=now, finished_at=now, seconds=0.0, attempts=attempt,
        executor="ray", error=BatchError(type=type(exc).__name__, message=message),
    )
