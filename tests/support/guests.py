"""Helpers for tests that run real guest processes: a plugin that keeps the
environments it makes (`Spy`), engines over it, a folder the guest can reach
(`folder_the_guest_can_reach`), and a look at live processes."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from rlm_graph import RLM
from rlm_graph.hooks import hookimpl
from rlm_graph_subprocess import SubprocessEnvironment
from tests.support.scripts import root_and_sub, scripted


class Spy:
    """A plugin registering ``subprocess-spy``: the real environment, kept for checks."""

    def __init__(self) -> None:
        self.envs: list[SubprocessEnvironment] = []

    @hookimpl
    def rlm_register_environments(self) -> dict[str, Any]:
        def factory(**kwargs: Any) -> SubprocessEnvironment:
            env = SubprocessEnvironment(**kwargs)
            self.envs.append(env)
            return env

        return {"subprocess-spy": factory}


def engine(root: Any, spy: Spy | None = None, sub: Any = None, **kwargs: Any) -> RLM:
    respond = root_and_sub(root) if sub is None else root_and_sub(root, sub)
    backend = {"respond": respond, **kwargs.pop("backend_kwargs", {})}
    return RLM(
        "scripted",
        backend,
        environment="subprocess-spy" if spy is not None else "subprocess",
        plugins=[spy] if spy is not None else [],
        **kwargs,
    )


def feedback(rlm: RLM, call: int) -> str:
    """The last message of the provider's ``call``-th request (0-based)."""
    return scripted(rlm).requests[call].messages[-1].content


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def processes_running(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if marker.encode() in handle.read() and alive(int(entry)):
                        found.append(int(entry))
            except OSError:
                continue
    return found


def tasks_of(uid: int) -> int:
    """Processes and threads whose real uid is ``uid``: what ``RLIMIT_NPROC`` counts for a
    guest of that uid without a user namespace of its own (other tests' guests too)."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                for task in os.listdir(f"/proc/{entry}/task"):
                    with open(f"/proc/{entry}/task/{task}/status") as handle:
                        uids = next(line for line in handle if line.startswith("Uid:"))
                    count += int(uids.split()[1]) == uid
            except (OSError, StopIteration):
                continue
    return count


HOST_TMP = ("/tmp", "/var/tmp", "/dev/shm")


def _unreachable(base: Path) -> str | None:
    """Why a folder made in ``base`` would be out of the guest's reach; None if it is not."""
    if not os.access(base, os.W_OK):
        return "not writable here"
    resolved = base.resolve()
    for tmp in HOST_TMP:
        if resolved.is_relative_to(Path(tmp).resolve()):
            return f"under {tmp}, which the guest sees as its own private folder"
    if os.geteuid() == 0:  # the guest runs as uid 65534: it must enter every folder above
        for folder in [resolved, *resolved.parents]:
            mode = stat.S_IMODE(folder.stat().st_mode)
            if not mode & stat.S_IXOTH:
                return f"{folder} is private (mode {mode:o}): uid 65534 cannot enter it"
    return None


@contextmanager
def folder_the_guest_can_reach(checkout: Path) -> Iterator[Path]:
    """A fresh folder beside ``checkout`` (mode 0755, removed after) that a guest given it
    in ``read_paths`` can reach: outside the folders its private ``/tmp`` covers, on a
    path its uid may enter. Skips, saying why, where there is none: a checkout under
    ``/tmp``, or in a private folder (mode 0700: any ``mktemp -d``, root's home) when the
    guest runs as another user."""
    refused = []
    for base in (checkout.parent, checkout):
        why = _unreachable(base)
        if why is None:
            break
        refused.append(f"{base}: {why}")
    else:
        pytest.skip(
            "no folder beside the checkout that the guest can reach ("
            + "; ".join(refused)
            + "): clone into a folder other users may enter, outside /tmp, to run this test"
        )
    folder = Path(tempfile.mkdtemp(prefix=".rlm-graph-test-", dir=base))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
