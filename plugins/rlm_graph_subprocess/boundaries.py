"""What the ``subprocess`` environment puts around its guest: limits, variables, network.

Invariants:
    - The guest's environment is built from an allow-list (`ALLOWED_VARIABLES` and
      ``LC_*``) plus what the user passes in ``env``, and no variable whose name holds
      one of `SECRET_MARKERS` ever reaches it, whoever asked for it.
    - Network isolation is probed once per process, by running ``unshare`` for real; if
      the probe fails the guest runs with the host's network and the environment says so
      (``network_isolated`` is false, ``isolation_report`` says why). It never fails a run.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any

import trio
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

import rlm_graph
from rlm_graph.errors import ConfigError

__all__ = [
    "ALLOWED_VARIABLES",
    "SECRET_MARKERS",
    "GuestLimits",
    "NetworkIsolation",
    "guest_environ",
    "probe_network_isolation",
]

ALLOWED_VARIABLES = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH")
"""Host variables the guest may see (besides ``LC_*``); ``HOME`` and ``TMPDIR`` are set
to the guest's own working directory."""

SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
"""A variable whose upper-cased name holds one of these never reaches the guest."""


class GuestLimits(BaseModel):
    """The boundaries of one guest process, from ``environment_kwargs``.

    Attributes:
        timeout: wall-clock seconds one block may run before the guest is killed and
            restarted (``None``: no per-block limit; the run's ``max_timeout`` holds).
        memory_limit_mb: address-space limit of the guest (``RLIMIT_AS``).
        cpu_seconds: CPU seconds one block may use (``RLIMIT_CPU``, re-armed per block).
        max_open_files: open file descriptors (``RLIMIT_NOFILE``).
        max_file_size_mb: the largest file the guest may write (``RLIMIT_FSIZE``).
        network: ``True`` to cut the guest off the network where the platform allows it.
        env: extra variables for the guest (names holding a secret marker are refused).
        start_timeout: seconds a new guest may take to start.
        close_grace: seconds a guest gets to exit on its own at close before it is killed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout: float | None = None
    memory_limit_mb: int | None = 2048
    cpu_seconds: float | None = 600.0
    max_open_files: int | None = 256
    max_file_size_mb: int | None = 1024
    network: bool = True
    env: dict[str, str] = {}
    start_timeout: float = 30.0
    close_grace: float = 1.0

    @field_validator("timeout", "cpu_seconds", "start_timeout", "close_grace")
    @classmethod
    def _positive(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("must be a positive number of seconds")
        return value

    @field_validator("memory_limit_mb")
    @classmethod
    def _enough_memory(cls, value: int | None) -> int | None:
        if value is not None and value < 200:
            raise ValueError(
                "must be at least 200 MB (the guest, Python and pydantic, reserves about "
                "180 MB of address space)"
            )
        return value

    @field_validator("max_open_files", "max_file_size_mb")
    @classmethod
    def _at_least_one(cls, value: int | None) -> int | None:
        if value is not None and value < 16:
            raise ValueError("must be at least 16")
        return value

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        refused = sorted(name for name in value if is_secret_name(name))
        if refused:
            raise ValueError(
                f"{', '.join(refused)} look like secrets and are never passed to the guest; "
                "give the guest a custom tool that uses the secret in the engine's process"
            )
        return value

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> GuestLimits:
        """Validate ``environment_kwargs``.

        Raises:
            ConfigError: an unknown keyword or a bad value, with what to fix.
        """
        try:
            return cls(**kwargs)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'environment_kwargs'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ConfigError(
                f"subprocess environment: {problems}. Known keywords: "
                f"{', '.join(cls.model_fields)}, output_cap"
            ) from None

    def rlimits(self) -> dict[str, Any]:
        """What the guest applies to itself at start (see `guest.apply_limits`)."""
        return {
            "memory_limit_mb": self.memory_limit_mb,
            "max_open_files": self.max_open_files,
            "max_file_size_mb": self.max_file_size_mb,
        }


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def guest_environ(workdir: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The guest's environment variables: the allow-list, never a secret.

    ``PYTHONPATH`` gains the folder rlm_graph was imported from, so the guest imports the
    same code as the engine even when it was not installed.
    """
    host = os.environ
    env = {
        name: value
        for name, value in host.items()
        if (name in ALLOWED_VARIABLES or name.startswith("LC_")) and not is_secret_name(name)
    }
    source = os.path.dirname(os.path.dirname(os.path.abspath(rlm_graph.__file__)))
    paths = [source, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("PATH", os.defpath)
    env["HOME"] = env["TMPDIR"] = workdir
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # glibc reserves 64 MB of address space per thread arena; a few threads would eat
    # an address-space limit before the model's code allocates anything.
    env["MALLOC_ARENA_MAX"] = "2"
    env.update({k: v for k, v in (extra or {}).items() if not is_secret_name(k)})
    return env


class NetworkIsolation:
    """The result of the probe: a command prefix, and a sentence for humans."""

    def __init__(self, prefix: tuple[str, ...], report: str) -> None:
        self.prefix = prefix
        self.report = report

    @property
    def isolated(self) -> bool:
        return bool(self.prefix)


_probed: NetworkIsolation | None = None


async def probe_network_isolation() -> NetworkIsolation:
    """Find a working way to start a process without network, once per process.

    Tries ``unshare --net`` as root and ``unshare --map-root-user --net`` otherwise (an
    unprivileged user namespace), by running ``true`` under it.
    """
    global _probed
    if _probed is not None:
        return _probed
    unshare = shutil.which("unshare")
    if not sys.platform.startswith("linux") or unshare is None:
        why = "not Linux" if not sys.platform.startswith("linux") else "no unshare command"
        _probed = NetworkIsolation((), f"network isolation unavailable: {why}")
        return _probed
    attempts = [(unshare, "--net"), (unshare, "--map-root-user", "--net")]
    if os.geteuid() != 0:
        attempts.reverse()
    failure = ""
    for prefix in attempts:
        result = await trio.run_process(
            [*prefix, "true"], check=False, capture_stdout=True, capture_stderr=True
        )
        if result.returncode == 0:
            _probed = NetworkIsolation(prefix, f"network isolated ({' '.join(prefix[1:])})")
            return _probed
        failure = result.stderr.decode(errors="replace").strip() or f"exit {result.returncode}"
    _probed = NetworkIsolation((), f"network isolation unavailable: unshare failed ({failure})")
    return _probed
