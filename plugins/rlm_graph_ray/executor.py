"""The ``ray`` batch executor: each completion one Ray call to a pool of long-lived
completion workers (`CompletionWorker` actors, each one trio loop running several
completions at once).

The driver (the process that called `run_batch`) keeps at most ``concurrency``
completions in flight, spread over the pool (each call to the worker with the fewest in
flight), reads each item's context before submitting it (workers need not see the
driver's files), and yields each result as its call finishes (``ray.wait``). Provider
limits hold cluster-wide: every completion's engine gets a `RayLimiter` that asks the
batch's `ClusterLimits` actor, pinned to the driver's node and shared by the batches of
one driver (each under its own keys).

A batch the caller stops reading early stops its workers first (`CompletionWorker.stop`:
their completions are cancelled and clean up), then kills them. When a worker process
or its node dies, every completion it was running fails: the driver removes the folders
the dead process left on this machine (`rlm_graph.scratch.sweep_stale`; a worker on
another node leaves them to the next engine started there), releases each dead
attempt's slots in the limits actor, replaces the worker, and runs those items again,
each alone on the new worker, a death counting against an item only when it ran alone
(up to ``max_retries`` such deaths; the result says how many attempts it took; see
`Calls`). Ray's own retries are off so that this release always happens first.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import signal
import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rlm_graph import scratch
from rlm_graph.errors import ConfigError
from rlm_graph.executors import BatchItem, BatchResult

from .calls import Calls
from .limits_actor import ClusterLimits
from .pool import CompletionWorker

__all__ = ["RayExecutor"]

_STOP_WAIT = 15.0  # seconds stopped workers get to clean up before they are killed
logger = logging.getLogger(__name__)
_CONNECT_WAIT = 5.0  # seconds a cluster's address gets to answer before ray.init

INSTALL_HINT = "the ray executor needs Ray: pip install 'rlm-graph[ray]'"

# The limits actor of each Ray job (driver) this process has run batches in.
_ACTORS: dict[str, Any] = {}


@dataclass(eq=False)
class _Pool:
    """Completion workers of one shape (workers, completions each, CPUs each), and how
    many batches of the driver are using them now."""

    shape: tuple[int, int, float]
    workers: list[Any]
    users: int = 1


# The completion workers of each Ray job; reused by its next batch of the same shape (a
# worker is a process: a second or two to start). They keep their CPUs reserved while the
# driver lives. Batches of one driver may run at once (threads): a pool is stopped only
# when no batch uses it.
_POOLS: dict[str, _Pool] = {}
_POOLS_LOCK = threading.Lock()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return ray


class RayExecutor:
    """Run a batch's completions on Ray workers, with provider limits held cluster-wide.

    Args:
        address: the cluster to join (``"auto"``, ``"ray://head:10001"``); default: the
            one this process is already connected to, else a new local one.
        task_cpus: CPUs Ray reserves per running completion (default 0.25: a completion
            mostly waits on its provider, so a node runs 4 per CPU), at most one CPU per
            completion worker.
        max_retries: how many times an item is run again after its worker died while
            it ran there alone (a death shared with other items counts for none of
            them: each runs again alone).
        init_kwargs: more keywords for ``ray.init`` (``runtime_env``...).
        forward_keys: send the workers the driver's environment variables the batch's
            providers take their keys from (`forwarded_variables`), set for the moment
            each completion's engine is built (default on; off: the nodes' own
            environment holds them).

    Joins the cluster ``address`` names when made (``ray.init``, unless this process has
    joined one), so a batch's settings are checked, the address with them, before
    anything is written; with no address, a local Ray starts when a batch first runs.

    Raises:
        ConfigError: Ray is not installed (the message says how to install it), or the
            cluster cannot be reached or joined.
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
        if address is not None:  # a cluster named: joined (or refused) before anything is
            self._connect()  # written; with none, Ray starts a local one when a batch runs

    def _connect(self) -> None:
        ray = self._ray
        if ray.is_initialized():
            return
        address = _address_to_join(self.address, self.init_kwargs.get("_temp_dir"))
        try:
            with _handlers_kept():
                ray.init(address=address, log_to_driver=False, **self.init_kwargs)
        except ConnectionError as exc:  # "auto" with no cluster on this machine, say
            raise ConfigError(f"cannot join the Ray cluster at {self.address!r}: {exc}") from None

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
            actor = (
                ray.remote(ClusterLimits)
                .options(
                    num_cpus=0,
                    max_concurrency=10_000,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
                )
                .remote()
            )
            ray.get(actor.statistics.remote())  # started: completions never wait for it
            _ACTORS[job] = actor
        return actor

    def run(
        self, items: Iterator[BatchItem], rlm_kwargs: Mapping[str, Any], *, concurrency: int
    ) -> Iterator[BatchResult]:
        self._connect()  # joined at construction; again if ray.shutdown() came between
        return self._run(items, dict(rlm_kwargs), concurrency)

    def _pool(self, completions: int) -> _Pool:
        """This driver's completion workers for ``completions`` at once, counted as used
        by one more batch (`_leave` when it ends).

        One worker per CPU of the cluster (never more than ``completions``), each running
        its share of them; each reserves ``task_cpus`` per completion it runs, at most
        one CPU (a share of 64 completions on a 2-CPU node still fits it), and has a
        thread for each (Ray starts them with the worker). An idle pool as big or bigger
        in each of these (an earlier batch's) serves; one smaller is stopped first. While
        another batch uses it, this batch shares it whatever its shape (a second pool
        could not get the CPUs the first holds: it would wait for them until that batch
        ends).
        """
        ray = self._ray
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        workers = min(completions, cpus)
        per_worker = math.ceil(completions / workers)
        shape = (workers, per_worker, self._worker_cpus(per_worker))
        job = ray.get_runtime_context().get_job_id()
        with _POOLS_LOCK:
            cached = _POOLS.get(job)
            if cached is not None and (_covers(cached.shape, shape) or cached.users > 0):
                cached.users += 1
                return cached
            _POOLS.pop(job, None)
        if cached is not None and cached.users == 0:
            self._stop_workers(cached.workers)
        pool = _Pool(shape, [self._new_worker(per_worker) for _ in range(workers)])
        ray.get([w.pid.remote() for w in pool.workers])  # started: the batch's clock is not theirs
        with _POOLS_LOCK:
            _POOLS.setdefault(job, pool)
        return pool

    def _leave(self, job: str, pool: _Pool, batch: str, early: bool) -> bool:
        """A batch on ``pool`` has ended (``early``: its caller stopped reading, calls
        still running). Its running completions cannot be interrupted but by the worker:
        with no other batch on the pool, the workers are stopped and killed; else only
        this batch's completions are stopped, and the pool serves on. Returns whether
        the workers were stopped and killed."""
        with _POOLS_LOCK:
            pool.users -= 1
            last = pool.users == 0
            retired = _POOLS.get(job) is not pool  # replaced by a pool of another shape
            if last and (early or retired) and _POOLS.get(job) is pool:
                del _POOLS[job]
        if last and (early or retired):
            self._stop_workers(pool.workers)
            return True
        if early:
            stops = [worker.stop.remote(batch=batch) for worker in pool.workers]
            try:
                self._ray.get(stops, timeout=_STOP_WAIT)
            except (self._ray.exceptions.RayError, TimeoutError):
                pass  # a worker that died meanwhile is replaced by the batch that finds it
        return False

    def _drain(self, refs: list[Any]) -> None:
        """Fetch the outcomes of the calls a stopped batch left (stopped or killed by
        now): Ray prints every error nobody fetched as an "Unhandled error" traceback,
        after the command's own last line."""
        ray = self._ray
        if not refs:
            return
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_STOP_WAIT)
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayError:
                pass  # the stop this batch asked for

    def _stop_workers(self, pool: list[Any]) -> None:
        """Stop the workers (their running completions cancelled and cleaned up), then
        kill them."""
        ray = self._ray
        try:
            ray.get([worker.stop.remote() for worker in pool], timeout=_STOP_WAIT)
        except (ray.exceptions.RayError, TimeoutError):
            pass  # a worker already dead, or stuck: killed below all the same
        for worker in pool:
            ray.kill(worker)
        scratch.sweep_stale()

    def _worker_cpus(self, per_worker: int) -> float:
        return min(1.0, self.task_cpus * per_worker)

    def _new_worker(self, per_worker: int) -> Any:
        """A `CompletionWorker` actor running up to ``per_worker`` completions at once.

        No restarts and no retries by Ray: the driver releases a dead attempt's slots
        before it runs the item again, on a new worker.
        """
        # Two threads more than completions: the limits actor's recalls never wait.
        return (
            self._ray.remote(CompletionWorker)
            .options(
                num_cpus=self._worker_cpus(per_worker),
                max_concurrency=per_worker + 2,
                max_restarts=0,
                max_task_retries=0,
            )
            .remote()
        )

    def _run(
        self, items: Iterator[BatchItem], rlm_kwargs: dict[str, Any], concurrency: int
    ) -> Iterator[BatchResult]:
        ray = self._ray
        job = ray.get_runtime_context().get_job_id()
        # Read ahead: a batch of fewer items than ``concurrency`` gets workers (and
        # threads) for the completions it can run, not for ``concurrency``.
        ahead = list(itertools.islice(items, concurrency))
        if not ahead:
            return
        keys = forwarded_variables(rlm_kwargs) if self.forward_keys else {}
        pool = self._pool(len(ahead))
        # Arguments in the object store, not the job's runtime_env (the dashboard shows it).
        arguments = (ray.put(rlm_kwargs), ray.put(keys))
        calls = Calls(self, pool.workers, pool.shape[1], concurrency, arguments)
        items = itertools.chain(ahead, items)
        try:
            calls.fill(items)
            while calls.pending or calls.failed_early:
                while calls.failed_early:
                    yield calls.failed_early.pop()
                if not calls.pending:
                    calls.fill(items)
                    continue
                ready, _ = ray.wait(list(calls.pending), num_returns=1)
                for ref in ready:
                    result = calls.finished(ref)
                    if result is not None:
                        yield result
                calls.fill(items)
        finally:
            if not self._leave(job, pool, calls.batch, early=bool(calls.pending)):
                for worker, holder in calls.holders.items():
                    if worker in calls.pool:  # a dead one forgets nothing
                        worker.forget.remote(holder)
            self._drain(list(calls.pending))
            calls.actor.forget_batch.remote(calls.batch)


def _covers(have: tuple[int, int, float], want: tuple[int, int, float]) -> bool:
    """A pool of shape ``have`` runs what one of shape ``want`` would: as many workers
    or more, as many completions each or more, as many CPUs each or more."""
    return all(mine >= wanted for mine, wanted in zip(have, want, strict=True))


# The signals whose handlers ``ray.init`` may replace (SIGTERM: a plain exit; starting a
# local cluster, one that kills it and exits 1).
_STOPS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name)
)


@contextmanager
def _handlers_kept() -> Iterator[None]:
    """The handlers of the stopping signals as they were before, put back after: the
    caller's own (the CLI's turn SIGTERM and SIGHUP into a Ctrl-C, which stops a batch
    cleanly: exit 143 and how to resume, docs/cli.md), not Ray's, which exits at once
    mid-write with its crash dump. Only the main thread handles signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {stop: signal.getsignal(stop) for stop in _STOPS}
    try:
        yield
    finally:
        for stop, handler in before.items():
            if handler is not None:  # None: set outside Python, nothing to put back
                signal.signal(stop, handler)


def _address_to_join(address: str | None, temp_dir: str | None) -> str | None:
    """The address to give ``ray.init``, once what it names answers: a cluster address
    (``host:port``, ``ray://host:port``) that nothing answers within `_CONNECT_WAIT`
    seconds is refused, as ``ray.init`` has no timeout of its own and waits for minutes
    on such an address, deaf to Ctrl-C. ``auto`` and no address are found as Ray finds
    them (``$RAY_ADDRESS``, then the cluster the last ``ray start`` on this machine
    recorded); a recorded cluster that is gone (killed, not stopped) is refused for
    ``auto``, and with no address a local Ray starts in its place.

    Raises:
        ConfigError: the cluster the address names, or ``auto`` finds, does not answer.
    """
    if address not in (None, "auto"):
        if address != "local":
            _check_answers(address, repr(address))
        return address
    named = os.environ.get("RAY_ADDRESS") or None
    if named not in (None, "auto", "local"):
        _check_answers(named, f"$RAY_ADDRESS ({named!r})")
        return address
    recorded = _recorded_cluster(temp_dir)
    if recorded is None:
        return address  # none: a local Ray starts, or (auto) Ray says there is none
    try:
        _check_answers(recorded, f"{recorded!r}, recorded by an earlier `ray start`")
    except ConfigError as exc:
        if address == "auto":
            raise ConfigError(f"{exc}; or leave out --ray-address for a local Ray") from None
        logger.warning("%s: starting a local Ray instead", exc)
        return "local"
    return address


def _recorded_cluster(temp_dir: str | None) -> str | None:
    """The cluster the last ``ray start`` on this machine recorded (Ray's own lookup of
    ``ray_current_cluster`` in its temp folder), if any."""
    try:
        from ray._private.utils import read_ray_address

        return read_ray_address(temp_dir) or None
    except (ImportError, AttributeError, OSError, TypeError):  # another Ray: its to find
        return None


def _check_answers(address: str, named: str) -> None:
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit():
        return  # not an address this check understands: Ray says what is wrong with it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_CONNECT_WAIT).close()
    except OSError as exc:
        raise ConfigError(
            f"cannot reach the Ray cluster at {named}: {exc.strerror or exc} (nothing "
            f"answered a connection there within {_CONNECT_WAIT:g} s); start the cluster "
            "(ray start --head) or give its address"
        ) from None


def forwarded_variables(rlm_kwargs: Mapping[str, Any]) -> dict[str, str]:
    """The driver's environment variables the batch's providers take their keys (and
    base URLs) from, with their values: what a worker on a node without them needs.

    Each provider of the batch (the backend's and ``other_backends``') is built here, as
    the batch's check built it, and names its own (``key_variables``: ``api_key_env``'s,
    the backend's key variable when its key is sent, its base-URL variable when the URL
    came from it); an ``api_key_env`` in the keywords is sent too, for a provider that
    names none. Nothing else of the environment, another service's key stays here; but
    for a provider that does not say (a plugin's without ``key_variables``, or with it
    ``None``), every ``*_API_KEY`` variable is sent, as it may read any of them.
    """
    from rlm_graph import RLM

    said = [
        getattr(provider, "key_variables", None)
        for _, provider in RLM(**rlm_kwargs).engine.router.providers
    ]
    names = {name for variables in said if variables is not None for name in variables}
    if any(variables is None for variables in said):
        names.update(name for name in os.environ if name.endswith("_API_KEY"))
    configured = [rlm_kwargs.get("backend_kwargs"), *(rlm_kwargs.get("other_backend_kwargs") or ())]
    names.update(
        kwargs["api_key_env"]
        for kwargs in configured
        if isinstance(kwargs, Mapping) and isinstance(kwargs.get("api_key_env"), str)
    )
    return {name: os.environ[name] for name in sorted(names) if os.environ.get(name)}
