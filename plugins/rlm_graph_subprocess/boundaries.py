"""What the ``subprocess`` environment puts around its guest: limits, variables, network.

Invariants:
    - The guest's environment is built from an allow-list (`ALLOWED_VARIABLES` and
      ``LC_*``) plus what the user passes in ``env``, and no variable whose name holds
      one of `SECRET_MARKERS` ever reaches it, whoever asked for it.
    - Limits are validated here, applied by the guest to itself (`GuestLimits.rlimits`)
      before it reads a request, with hard = soft so model code cannot raise them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

import rlm_graph
from rlm_graph.errors import config_error

__all__ = [
    "ALLOWED_VARIABLES",
    "GUEST_RESERVE_MB",
    "SECRET_MARKERS",
    "GuestLimits",
    "guest_environ",
]

ALLOWED_VARIABLES = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH")
"""Host variables the guest may see (besides ``LC_*``); ``HOME`` and ``TMPDIR`` are set
to the guest's own working directory."""

GUEST_RESERVE_MB = 192
"""Address space the guest keeps for itself whatever ``tmp_size_mb`` takes (Python,
pydantic and the reader thread reserve about 180 MB at start)."""

SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
"""A variable whose upper-cased name holds one of these never reaches the guest."""


_MAY_BE_NONE = frozenset({"timeout", "cpu_seconds"})
"""Limits whose None means none."""


class GuestLimits(BaseModel):
    """The boundaries of one guest process, from ``environment_kwargs``.

    Attributes:
        timeout: wall-clock seconds one block may run before the guest is killed and
            restarted (``None``: no per-block limit; the run's ``max_timeout`` holds).
        memory_limit_mb: address-space limit of the guest (``RLIMIT_AS``).
        cpu_seconds: CPU seconds one block may use (``RLIMIT_CPU``, re-armed per block).
        max_open_files: open file descriptors (``RLIMIT_NOFILE``).
        max_file_size_mb: the largest file the guest may write (``RLIMIT_FSIZE``).
        max_processes: processes and threads the guest may have (``RLIMIT_NPROC``); in
            its own user namespace these are the guest's alone, else every process of
            its uid counts.
        max_message_mb: the largest protocol message the engine accepts from the guest;
            past it the guest is killed and the model told.
        network: ``True`` to cut the guest off the network where the platform allows it.
        read_paths: files and folders the guest may read besides its runtime and its own
            folders (where the kernel has Landlock; elsewhere it reads what its uid can).
        tmp_size_mb: the size of the guest's private ``/tmp`` (also ``/var/tmp`` and
            ``/dev/shm``), taken out of ``memory_limit_mb`` (default: a quarter of it,
            leaving the guest at least `GUEST_RESERVE_MB` of address space).
        max_files: files and folders the guest may have in its private ``/tmp``.
        env: extra variables for the guest (names holding a secret marker are refused).
        start_timeout: seconds a new guest may take to start; a data request (loading a
            context...) may take the larger of it and ``timeout``.
        close_grace: seconds a guest gets to exit on its own at close before it is killed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout: float | None = None
    memory_limit_mb: int | None = 2048
    cpu_seconds: float | None = 600.0
    max_open_files: int | None = 256
    max_file_size_mb: int | None = 1024
    max_processes: int | None = 256
    max_message_mb: float = 16.0
    network: bool = True
    read_paths: tuple[str, ...] = ()
    tmp_size_mb: int | None = None
    max_files: int = 10_000
    env: dict[str, str] = {}
    start_timeout: float = 30.0
    close_grace: float = 1.0

    @field_validator("timeout", "cpu_seconds", "start_timeout", "close_grace", "max_message_mb")
    @classmethod
    def _positive(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and not 0 < value < math.inf:  # NaN and infinity too
            unbounded = " (None for no limit)" if info.field_name in _MAY_BE_NONE else ""
            raise ValueError(f"must be a positive finite number{unbounded}")
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

    @field_validator("read_paths", mode="before")
    @classmethod
    def _existing_paths(cls, value: Any) -> tuple[str, ...]:
        if isinstance(value, str | os.PathLike):
            value = [value]
        if any(not os.fspath(path) for path in value):  # "" would be the current folder
            raise ValueError("an empty path names no file or folder")
        paths = tuple(os.path.abspath(os.fspath(path)) for path in value)
        missing = [path for path in paths if not os.path.exists(path)]
        if missing:
            raise ValueError(f"{', '.join(missing)}: no such file or folder")
        return paths

    @model_validator(mode="after")
    def _tmp_fits(self) -> GuestLimits:
        if self.tmp_size_mb is not None and self.tmp_size_mb < 1:
            raise ValueError("tmp_size_mb must be at least 1")
        if (
            self.tmp_size_mb is not None
            and self.memory_limit_mb is not None
            and self.memory_limit_mb - self.tmp_size_mb < GUEST_RESERVE_MB
        ):
            raise ValueError(
                f"tmp_size_mb ({self.tmp_size_mb}) is taken out of memory_limit_mb "
                f"({self.memory_limit_mb}), which must leave the guest at least "
                f"{GUEST_RESERVE_MB} MB"
            )
        return self

    @property
    def tmp_mb(self) -> int:
        """The private ``/tmp``'s size in MB (see ``tmp_size_mb``)."""
        if self.tmp_size_mb is not None:
            return self.tmp_size_mb
        if self.memory_limit_mb is None:
            return 512
        quarter = self.memory_limit_mb // 4
        return max(1, min(quarter, self.memory_limit_mb - GUEST_RESERVE_MB))

    def tmp_options(self) -> str:
        """The tmpfs options of the private ``/tmp``."""
        return f"size={self.tmp_mb}m,nr_inodes={self.max_files},mode=1777,nosuid,nodev"

    @field_validator("max_open_files", "max_file_size_mb", "max_processes", "max_files")
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
            raise config_error(
                "subprocess environment",
                exc,
                unnamed="environment_kwargs",
                hint=f". Known keywords: {', '.join(cls.model_fields)}, output_cap",
            ) from None

    def rlimits(self, private_tmp: bool = False) -> dict[str, Any]:
        """What the guest applies to itself at start (see `guest.apply_limits`); with a
        private ``/tmp``, its size comes out of the address space."""
        memory = self.memory_limit_mb
        if memory is not None and private_tmp:
            memory -= self.tmp_mb
        return {
            "memory_limit_mb": memory,
            "max_open_files": self.max_open_files,
            "max_file_size_mb": self.max_file_size_mb,
            "max_processes": self.max_processes,
        }


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def guest_environ(
    workdir: str, extra: Mapping[str, str] | None = None, tmp: str | None = None
) -> dict[str, str]:
    """The guest's environment variables: the allow-list, never a secret.

    ``PYTHONPATH`` gains the folder rlm_graph was imported from, so the guest imports the
    same code as the engine even when it was not installed. ``TMPDIR`` is ``tmp`` (the
    guest's private ``/tmp``) or else its working directory.
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
    env["HOME"] = workdir
    env["TMPDIR"] = tmp or workdir
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # glibc reserves 64 MB of address space per thread arena; a few threads would eat
    # an address-space limit before the model's code allocates anything.
    env["MALLOC_ARENA_MAX"] = "2"
    env.update({k: v for k, v in (extra or {}).items() if not is_secret_name(k)})
    return env
