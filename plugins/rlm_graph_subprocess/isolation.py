"""How the guest is kept away from the engine: namespaces and an unprivileged user.

The guest is started behind a command prefix built from util-linux's ``unshare`` and
``setpriv``. The strongest plan the machine accepts is chosen once per engine process,
by starting the real interpreter under each plan in turn (``python -c "import pydantic"``)
until one works:

    engine as root:   setpriv --reuid=65534 ... unshare --user --pid --mount-proc [--net]
                      unshare --pid --mount-proc [--net] setpriv --reuid=65534 ...
                      the same, the guest keeping CAP_DAC_READ_SEARCH (when uid 65534
                      cannot reach the interpreter, e.g. a pyenv under /root)
                      setpriv --reuid=65534 alone, then unshare --net alone, then nothing
    engine as a user: unshare --user --map-current-user --pid --mount-proc [--net]
                      unshare --map-root-user --net, then nothing

Invariants:
    - A guest in its own PID namespace with a private ``/proc`` cannot name the engine's
      process: it cannot signal it, ``ptrace`` it, or open ``/proc/<engine>/environ`` or
      ``/mem``. As root, the guest also runs as uid/gid 65534 with no capabilities (bar
      CAP_DAC_READ_SEARCH in the plan that says so) and ``no_new_privs``.
    - ``unshare --fork --kill-child``: the guest is PID 1 of its namespace and dies with
      its launcher; when it dies the kernel kills everything else in the namespace, so
      killing the launcher's process group ends everything the guest started, also what
      left the group with ``setsid``.
    - Choosing never fails a run: a plan the machine refuses is skipped, and a plan short
      of the strongest is logged once, naming what is missing: a warning, or an info
      record when only the user namespace is missing (the boundary against the engine
      holds; ``max_processes`` then counts every process of uid 65534).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

import trio

import rlm_graph

from .boundaries import guest_environ

__all__ = ["UNPRIVILEGED_ID", "Isolation", "choose_isolation"]

logger = logging.getLogger("rlm_graph.subprocess")

UNPRIVILEGED_ID = 65534
"""The uid and gid a guest runs as when the engine runs as root ("nobody")."""

_PID = ("--pid", "--fork", "--kill-child", "--mount-proc")
_REPL_DIR = os.path.join(os.path.dirname(os.path.abspath(rlm_graph.__file__)), "repl")
# What a guest needs: its interpreter, pydantic, and rlm_graph's source.
_PROBE = "import os, pydantic; os.listdir({repl!r})"


class Isolation:
    """One plan: the command prefix, and what it gives the guest.

    Attributes:
        prefix: the command that goes before the interpreter.
        pid_namespace: the guest has its own PID namespace and ``/proc``.
        network: the guest has its own (empty) network namespace.
        user_namespace: the guest has its own user namespace (its ``RLIMIT_NPROC``
            counts its own processes only).
        drops_to: the uid the guest runs as, when it is not the engine's.
        reads_everything: the guest keeps CAP_DAC_READ_SEARCH.
    """

    def __init__(
        self,
        prefix: Sequence[str] = (),
        *,
        pid_namespace: bool = False,
        network: bool = False,
        user_namespace: bool = False,
        drops_to: int | None = None,
        reads_everything: bool = False,
    ) -> None:
        self.prefix = tuple(prefix)
        self.pid_namespace = pid_namespace
        self.network = network
        self.user_namespace = user_namespace
        self.drops_to = drops_to
        self.reads_everything = reads_everything
        self.refused: list[str] = []

    def missing(self, ideal: Isolation) -> list[str]:
        """What this plan lacks compared with ``ideal``, in words."""
        gaps = []
        if ideal.pid_namespace and not self.pid_namespace:
            gaps.append(
                "no PID namespace (the guest can signal the engine and read /proc of "
                "processes of its user)"
            )
        if ideal.drops_to is not None and self.drops_to is None:
            gaps.append("no unprivileged user (the guest runs as root)")
        if self.reads_everything:
            gaps.append(
                f"uid {UNPRIVILEGED_ID} cannot reach {sys.executable} (a folder on the way "
                "is closed to others), so the guest keeps CAP_DAC_READ_SEARCH and can read "
                "every file"
            )
        if ideal.user_namespace and not self.user_namespace and self.pid_namespace:
            gaps.append(
                "no user namespace (max_processes counts every process of uid "
                f"{UNPRIVILEGED_ID}, not the guest's alone)"
            )
        if ideal.network and not self.network:
            gaps.append("no network namespace (the guest has the host's network)")
        return gaps

    def describe(self) -> str:
        """A sentence for ``isolation_report``."""
        if not self.prefix:
            return "no isolation: the guest runs as the engine's user, beside it"
        parts = []
        if self.pid_namespace:
            parts.append("own PID namespace and /proc")
        if self.drops_to is not None:
            extra = " with CAP_DAC_READ_SEARCH" if self.reads_everything else ""
            parts.append(f"uid {self.drops_to}{extra}")
        if self.user_namespace:
            parts.append("own user namespace")
        parts.append("network isolated" if self.network else "host network")
        return ", ".join(parts)


def _setpriv(setpriv: str, read_everything: bool = False) -> list[str]:
    command = [
        setpriv,
        f"--reuid={UNPRIVILEGED_ID}",
        f"--regid={UNPRIVILEGED_ID}",
        "--clear-groups",
        "--no-new-privs",
    ]
    if read_everything:
        command += ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return [*command, "--"]


def _plans(network: bool, root: bool) -> list[Isolation]:
    """Every plan for this machine, strongest first."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    net = ["--net"] if network else []
    plans: list[Isolation] = []
    if root and setpriv and unshare:
        user = [unshare, "--user", "--map-current-user", *_PID, *net]
        plans.append(
            Isolation(
                [*_setpriv(setpriv), *user],
                pid_namespace=True,
                network=network,
                user_namespace=True,
                drops_to=UNPRIVILEGED_ID,
            )
        )
        for everything in (False, True):
            plans.append(
                Isolation(
                    [unshare, *_PID, *net, *_setpriv(setpriv, everything)],
                    pid_namespace=True,
                    network=network,
                    drops_to=UNPRIVILEGED_ID,
                    reads_everything=everything,
                )
            )
    if root and setpriv:
        for everything in (False, True):
            plans.append(
                Isolation(
                    _setpriv(setpriv, everything),
                    drops_to=UNPRIVILEGED_ID,
                    reads_everything=everything,
                )
            )
    if not root and unshare:
        plans.append(
            Isolation(
                [unshare, "--user", "--map-current-user", *_PID, *net],
                pid_namespace=True,
                network=network,
                user_namespace=True,
            )
        )
        if network:
            plans.append(Isolation([unshare, "--map-root-user", "--net"], network=True))
    if root and unshare and network:
        plans.append(Isolation([unshare, "--net"], network=True))
    plans.append(Isolation())
    return plans


def _ideal(network: bool, root: bool, user_namespace: bool = True) -> Isolation:
    return Isolation(
        ("ideal",),
        pid_namespace=True,
        network=network,
        user_namespace=user_namespace,
        drops_to=UNPRIVILEGED_ID if root else None,
    )


_chosen: dict[bool, Isolation] = {}
_warned: set[str] = set()


async def choose_isolation(network: bool) -> Isolation:
    """The strongest plan this machine accepts, chosen once per process.

    Args:
        network: whether the plan should cut the guest off the network.

    Returns:
        The plan; `Isolation.refused` says why each stronger plan was skipped.
    """
    if network in _chosen:
        return _chosen[network]
    root = os.geteuid() == 0
    refused: list[str] = []
    chosen = Isolation()
    if sys.platform.startswith("linux"):
        for plan in _plans(network, root):
            why = await _try(plan) if plan.prefix else None
            if why is None:
                chosen = plan
                break
            refused.append(f"{plan.describe()}: {why}")
    chosen.refused = refused
    _chosen[network] = chosen
    gaps = chosen.missing(_ideal(network, root))
    if not sys.platform.startswith("linux"):
        gaps = ["not Linux: no namespaces, the guest runs as the engine's user beside it"]
    message = "; ".join(gaps)
    if gaps and message not in _warned:
        _warned.add(message)
        # Without a user namespace alone, the boundary against the engine holds (only
        # max_processes is counted per uid): worth a note, not a warning on every run.
        minor = not (chosen.missing(_ideal(network, root, user_namespace=False)))
        logger.log(
            logging.INFO if minor and sys.platform.startswith("linux") else logging.WARNING,
            "subprocess environment: the guest is less isolated than it could be: %s. "
            "See docs/environments.md (what each environment stops).",
            message,
        )
    return chosen


async def _try(plan: Isolation) -> str | None:
    """``None`` if the interpreter starts and imports the guest's needs under ``plan``."""
    with tempfile.TemporaryDirectory(prefix="rlm-graph-probe-") as home:
        # Root's fresh folder is closed to uid 65534; the probe must run where a guest could.
        os.chmod(home, 0o755)
        try:
            result = await trio.run_process(
                [*plan.prefix, sys.executable, "-P", "-c", _PROBE.format(repl=_REPL_DIR)],
                check=False,
                capture_stdout=True,
                capture_stderr=True,
                cwd=home,
                env=guest_environ(home),
            )
        except OSError as exc:
            return str(exc)
    if result.returncode == 0:
        return None
    lines = result.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit {result.returncode}"
