"""Landlock: the guest may read what it needs to run, its own folder and what the user
granted, and nothing else.

Landlock (Linux 5.13+, unprivileged) lets a process take rights away from itself and
its descendants for good. The guest applies a ruleset to itself at start, after its
namespaces and uid are set up and before it reads its first request, so model code never
runs without it. This module is loaded by the guest by file path (it imports nothing of
rlm-graph, so the guest does not import the plugin's package, and trio with it) and by
the engine as ``rlm_graph_subprocess.landlock``, to learn the kernel's ABI.

The system calls are made through ``ctypes`` (numbers 444-446 on every architecture
since Linux 5.13). No PyPI binding was taken: the one with the most use is a
development release only.

Invariants:
    - `restrict` handles every file-system right the kernel's ABI knows, so a right the
      ruleset does not grant is denied, whatever the file's mode and the guest's uid;
      rights the ABI lacks are masked out, never asked for (older kernels accept the
      ruleset).
    - Writable folders never get ``EXECUTE``: the guest cannot ``execve`` a file it wrote.
    - ``no_new_privs`` is set before the ruleset (Landlock requires it; it also stops
      setuid programs from gaining privileges).
    - A path that does not exist is skipped; any other failure raises `LandlockError`
      (the guest then exits: it never runs without the ruleset it was asked to apply).
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["LandlockError", "abi_version", "apply", "grants_for", "restrict", "runtime_paths"]

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# File-system rights (include/uapi/linux/landlock.h), by the ABI that brought them.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1, 2, 4, 8
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 16, 32, 64, 128
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 256, 512, 1024, 2048, 4096
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2  # ABI 4
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1, 2  # ABI 6

READ = READ_FILE | READ_DIR
RUN = READ | EXECUTE
WRITE = (
    READ
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_SYM
    | REFER
    | TRUNCATE
)

# What every Python process reaches for once it runs: programs and shared libraries
# (also for the subprocesses model code starts), the loader's cache, the time zone.
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_DEVICES = {
    "/dev/null": READ_FILE | WRITE_FILE | TRUNCATE,
    "/dev/zero": READ_FILE,
    "/dev/full": READ_FILE | WRITE_FILE,
    "/dev/random": READ_FILE,
    "/dev/urandom": READ_FILE,
}
# Folders too broad to grant as an interpreter's prefix (a Python built with prefix=/).
_TOO_BROAD = ("/", "/home", "/root", "/etc", "/var", "/tmp", "/opt")


class LandlockError(OSError):
    """The kernel refused the ruleset (the guest must not run without it)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi_version() -> int:
    """The Landlock ABI this kernel offers (0: none, or not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        found = int(
            _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
        )
    except (OSError, AttributeError):
        return 0
    return max(found, 0)


def fs_rights(abi: int) -> int:
    """Every file-system right ABI ``abi`` knows."""
    known = [mask for version, mask in _FS_BY_ABI.items() if version <= abi]
    return max(known) if known else 0


def runtime_paths() -> dict[str, int]:
    """What this interpreter needs to go on running: its prefixes (or, for a prefix too
    broad to grant, its library folders), its executable, the import paths outside the
    folder rlm_graph was imported from (the project's own checkout stays closed), the
    system's programs and libraries, and a few devices."""
    import rlm_graph

    grants: dict[str, int] = {}
    package = os.path.dirname(os.path.abspath(rlm_graph.__file__))
    source = os.path.dirname(package)
    prefixes = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    for prefix in prefixes:
        if os.path.realpath(prefix) not in _TOO_BROAD:
            grants[prefix] = RUN
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
            grants[sysconfig.get_path(key, vars=scheme_vars)] = RUN
    checkout = any(
        os.path.exists(os.path.join(source, name))
        for name in ("pyproject.toml", "setup.py", "setup.cfg", ".git")
    )
    for entry in sys.path:
        real = os.path.realpath(entry) if entry else ""
        if real and real not in _TOO_BROAD and not (checkout and real == os.path.realpath(source)):
            grants.setdefault(entry, RUN)
    grants[package] = RUN
    grants[os.path.realpath(sys.executable)] = READ_FILE | EXECUTE
    for folder in _SYSTEM:
        grants[folder] = RUN
    for file in _SYSTEM_FILES:
        grants[file] = READ_FILE
    grants["/sys/devices/system/cpu"] = READ  # os.cpu_count()
    grants.update(_DEVICES)
    return grants


def restrict(
    grants: Mapping[str, int],
    *,
    abi: int,
    deny_tcp: bool = False,
) -> None:
    """Apply a ruleset to this process: only ``grants`` (path -> rights) stay open.

    Args:
        grants: each path and the rights granted beneath it (a file: file rights only).
        abi: the kernel's ABI (`abi_version`); rights it lacks are left out.
        deny_tcp: refuse every TCP ``bind`` and ``connect`` (ABI 4 and later), for a guest
            that has no network namespace of its own.

    Raises:
        LandlockError: the kernel refused (no Landlock, or a bad ruleset).
    """
    libc = _libc()
    handled = fs_rights(abi)
    attr = _RulesetAttr(handled_access_fs=handled)
    if deny_tcp and abi >= 4:
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP
    if abi >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL
    ruleset = libc.syscall(
        _CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0
    )
    if ruleset < 0:
        raise LandlockError(ctypes.get_errno(), "landlock_create_ruleset refused")
    try:
        for path, rights in grants.items():
            _add_rule(libc, int(ruleset), path, rights & handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) refused")
        if libc.syscall(_RESTRICT_SELF, int(ruleset), 0) != 0:
            raise LandlockError(ctypes.get_errno(), "landlock_restrict_self refused")
    finally:
        os.close(int(ruleset))


def _add_rule(libc: Any, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # not there (or not reachable): nothing to grant
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS
        if not rights:
            return
        rule = _PathBeneath(allowed_access=rights, parent_fd=fd)
        if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise LandlockError(ctypes.get_errno(), f"landlock_add_rule refused {path!r}")
    finally:
        os.close(fd)


def grants_for(
    *,
    write: Iterable[str],
    read: Iterable[str],
    proc: bool,
) -> dict[str, int]:
    """The guest's whole ruleset: the runtime (`runtime_paths`), ``read`` (its contexts,
    the user's ``read_paths``), ``write`` (its working folder, its private ``/tmp``) and,
    in its own PID namespace, ``/proc`` (read only: it shows the guest's processes)."""
    grants = runtime_paths()
    if proc:
        grants["/proc"] = READ
    for path in read:
        grants[path] = grants.get(path, 0) | READ
    for path in write:
        grants[path] = WRITE
    return grants


def apply(config: Mapping[str, Any]) -> None:
    """Set ``no_new_privs`` and apply the ruleset the engine described (``abi``,
    ``write``, ``read``, ``proc``, ``deny_tcp``; an ``abi`` of 0 applies none)."""
    abi = int(config.get("abi") or 0)
    if abi <= 0:
        if sys.platform.startswith("linux"):
            _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # it cannot be unset
        return
    grants = grants_for(write=config["write"], read=config["read"], proc=bool(config["proc"]))
    restrict(grants, abi=abi, deny_tcp=bool(config.get("deny_tcp")))


def _probe(setup: Mapping[str, Any]) -> None:
    """What the engine's choice of a plan runs: restrict as a guest would, then import
    the guest's needs and write where the guest may."""
    apply(setup["sandbox"])
    import pydantic  # noqa: F401

    os.listdir(setup["probe"])
    for folder in setup["sandbox"]["write"]:
        path = os.path.join(folder, f"probe-{os.getpid()}")
        with open(path, "w") as handle:
            handle.write("ok")
        os.remove(path)


if __name__ == "__main__":
    _probe(json.loads(sys.argv[1]))
