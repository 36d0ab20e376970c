"""Helpers for tests that run real guest processes: a plugin that keeps the
environments it makes (`Spy`), engines over it, and a look at live processes."""

from __future__ import annotations

import os
from typing import Any

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
