from __future__ import annotations

import functools
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio.testing

# The suite sends itself Ctrl-C (and its commands SIGINT, SIGTERM, SIGHUP) as a terminal
# would. Started as a script's background job (`make test &`), or under `nohup`, those
# signals come in ignored; the tests' own process and the commands they start get them
# back (see `as_from_a_terminal`).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# pytest-xdist's workers set COLUMNS=80 and LINES=24 for their own output. The commands
# the tests start in a pseudo-terminal must see that terminal's size, as under one
# process: rich takes COLUMNS over the terminal's own width.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``make test`` (pytest-xdist, ``--dist loadfile``): a test file runs whole on
    one worker, and every file with a test on a Ray cluster on the same one, so that there
    is one cluster for the session, not one per worker on the same two cores. (xdist's
    ``xdist_group`` marks group nothing under pytest 9.2, whose node ids xdist can no
    longer rename: every worker started a cluster of its own.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndRay(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "ray" if _on_ray(config.rootpath / path) else path

    return FilesAndRay(config, log)


@functools.cache
def _on_ray(path: Path) -> bool:
    """Whether the test file at ``path`` has a test on the session's Ray cluster."""
    try:
        return "ray_cluster" in path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Mock time that jumps ahead whenever every task is blocked: latency costs nothing."""
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture
def patient_clock() -> trio.testing.MockClock:
    """Mock time that jumps only after 0.5 s of real idleness: model code running in a
    worker thread (a ``local`` block) finishes before the clock moves on. With
    ``autojump_clock`` the clock jumps the moment every task waits for that thread, so a
    deadline could fall before a block that takes microseconds had run (on a loaded
    machine, now and then; at 0.2 s, too, once in fifteen runs beside two busy loops)."""
    return trio.testing.MockClock(autojump_threshold=0.5)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """One real local Ray cluster (2 CPUs) for the whole test session (batches, evaluations)."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'rlm-graph[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    """A skip inside a trio test keeps its reason. pytest-trio (0.8) turns the lone
    `pytest.skip("why")` of a test into a bare ``pytest.skip()`` ("Skipped"); the
    original is the context of that one, inside the exception group."""
    try:
        return (yield)
    except pytest.skip.Exception as bare:
        original = _lone_skip(bare.__context__)
        if bare.msg or original is None:
            raise
        raise original from None


def _lone_skip(error: BaseException | None) -> BaseException | None:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error if isinstance(error, pytest.skip.Exception) else None
