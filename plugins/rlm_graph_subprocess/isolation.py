"""How the guest is kept away from the engine: namespaces and an unprivileged user.

The guest is started behind a command prefix built from util-linux's ``unshare`` and
``setpriv``. The strongest plan the machine accepts is chosen once per engine process,
by starting the real interpreter under each plan in turn (``python -c "import pydantic"``)
until one works:

    engine as root:   unshare --pid --mount-proc [--net], a private /tmp (`MOUNT_TMP`),
                      setpriv --reuid=65534 ..., unshare --user
                      the same without the inner user namespace
                      setpriv --reuid=65534 ... unshare --user --pid --mount-proc [--net]
                      unshare --pid --mount-proc [--net] setpriv --reuid=65534 ...
                      the same, the guest keeping CAP_DAC_READ_SEARCH (when uid 65534
                      cannot reach the interpreter, e.g. a pyenv under /root)
                      setpriv --reuid=65534 alone, then unshare --net alone, then nothing
    engine as a user: unshare --user --map-root-user --pid --mount-proc [--net], a
                      private /tmp, unshare --user --map-user=<the user> (no root left)
                      unshare --user --map-current-user --pid --mount-proc [--net]
                      unshare --map-root-user --net, then nothing

Whatever the plan, where the kernel has Landlock the guest restricts itself at start to
the files it needs (`landlock`): the runtime, its own folders, the user's ``read_paths``.

Invariants:
    - A guest in its own PID namespace with a private ``/proc`` cannot name the engine's
      process: it cannot signal it, ``ptrace`` it, or open ``/proc/<engine>/environ`` or
      ``/mem``. As root, the guest also runs as uid/gid 65534 with no capabilities (bar
      CAP_DAC_READ_SEARCH in the plan that says so) and ``no_new_privs``.
    - ``unshare --fork --kill-child``: the guest is PID 1 of its namespace and dies with
      its launcher; when it dies the kernel kills everything else in the namespace, so
      killing the launcher's process group ends everything the guest started, also what
      left the group with ``setsid``.
    - A private ``/tmp`` is one tmpfs, mounted by root (real, or of the guest's first user
      namespace) before the guest's uid is set, and seen at ``/tmp``, ``/var/tmp`` and
      ``/dev/shm``, and at the guest's working folder (a folder of its own in it): capped
      in size and files, and gone with the guest's mount namespace. The guest cannot
      unmount it (it has no capability over that namespace).
    - Choosing never fails a run: a plan the machine refuses is skipped, and a plan short
      of the strongest is logged once, naming what is missing: a warning, or an info
      record when only the user namespace is missing (the boundary against the engine
      holds; ``max_processes`` then counts every process of uid 65534).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Sequence

import trio

import rlm_graph

from .boundaries import guest_environ
from .landlock import abi_version

__all__ = ["MOUNT_TMP", "UNPRIVILEGED_ID", "Isolation", "choose_isolation"]

logger = logging.getLogger("rlm_graph.subprocess")

UNPRIVILEGED_ID = 65534
"""The uid and gid a guest runs as when the engine runs as root ("nobody")."""

_PID = ("--pid", "--fork", "--kill-child", "--mount-proc")
_REPL_DIR = os.path.join(os.path.dirname(os.path.abspath(rlm_graph.__file__)), "repl")
_LANDLOCK_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "landlock.py")

MOUNT_TMP = """set -e
options=$1 work=$2 count=$3
shift 3
owner=$(stat -c %u:%g "$work") mode=$(stat -c %a "$work")
exec 3</tmp
if [ -d /var/tmp ] && [ ! -L /var/tmp ]; then exec 4</var/tmp; fi
if [ -d /dev/shm ] && [ ! -L /dev/shm ]; then exec 5</dev/shm; fi
mount -t tmpfs -o "$options" rlm-graph-guest /tmp
mkdir /tmp/tmp /tmp/work
chmod 1777 /tmp/tmp
chown "$owner" /tmp/work 2>/dev/null || chown "${owner%%:*}" /tmp/work
chmod "$mode" /tmp/work
exec 9</tmp/work
mount --bind /tmp/tmp /tmp
for folder in /var/tmp /dev/shm; do
  if [ -d "$folder" ] && [ ! -L "$folder" ]; then mount --bind /tmp "$folder"; fi
done
i=0
for entry do
  [ "$i" -lt "$count" ] || break
  i=$((i + 1))
  id=${entry%%:*} entry=${entry#*:}
  id=$id:${entry%%:*} path=${entry#*:}
  case $path in
    /tmp/*) source=/proc/$$/fd/3/${path#/tmp/} ;;
    /var/tmp/*) source=/proc/$$/fd/4/${path#/var/tmp/} ;;
    /dev/shm/*) source=/proc/$$/fd/5/${path#/dev/shm/} ;;
    *) continue ;;
  esac
  [ ! -e "$path" ] || continue
  if [ -d "$source" ]; then
    mkdir -p "$path"
  elif [ -f "$source" ]; then
    mkdir -p "${path%/*}"
    : > "$path"
  else
    continue
  fi
  mount --no-canonicalize --bind "$source" "$path"
  mount -o remount,bind,ro,nosuid,nodev "$path"
  if [ "$(stat -L -c %d:%i "$path")" != "$id" ]; then
    umount "$path"
  fi
done
exec 3<&- 4<&- 5<&-
shift "$count"
mount --no-canonicalize --bind /proc/$$/fd/9 "$work"
exec 9<&-
cd "$work"
unset PWD OLDPWD
exec "$@"
"""
"""The guest's private ``/tmp`` and working folder, run by ``sh`` as root of the guest's
mount namespace: ``sh -c MOUNT_TMP sh <tmpfs options> <working folder> <count> <path>...
<command...>``, each ``path`` given as ``dev:inode:path``. One tmpfs holds two folders: ``tmp``, seen at ``/tmp`` (``/var/tmp``,
``/dev/shm``), and ``work``, seen at the working folder's path (owned as that folder
is), so that together they hold at most the tmpfs's size and files. Each ``path`` (a
real path under ``/tmp``, ``/var/tmp`` or ``/dev/shm``: the environment's folder, the
engine's interpreter, packages and rlm_graph where they live there, the user's
``read_paths`` there) is bound back, read-only, at its own path once the tmpfs covers
it, from the folder it was in (held open before the tmpfs came): a folder or a regular
file only, and only if it is still the file the engine found (its device and inode: a
folder on the way swapped for a symlink since is not followed into). A path gone since
is skipped. The guest then starts in its working folder as mounted."""

_MASKED = ("/tmp", "/var/tmp", "/dev/shm")


class Isolation:
    """One plan: the command prefix, and what it gives the guest.

    Attributes:
        prefix: the command that goes before the interpreter (for a plan with a
            private ``/tmp``, `command` puts the mount step in the middle).
        pid_namespace: the guest has its own PID namespace and ``/proc``.
        network: the guest has its own (empty) network namespace.
        user_namespace: the guest has its own user namespace (its ``RLIMIT_NPROC``
            counts its own processes only).
        drops_to: the uid the guest runs as, when it is not the engine's.
        reads_everything: the guest keeps CAP_DAC_READ_SEARCH.
        private_tmp: the guest gets its own ``/tmp``, ``/var/tmp`` and ``/dev/shm``.
        landlock: the Landlock ABI the guest restricts itself with (0: none).
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
        then: Sequence[str] = (),
        landlock: int = 0,
    ) -> None:
        self.prefix = (*prefix, *then)
        self._before_tmp = tuple(prefix)
        self._after_tmp = tuple(then) if then else None
        self.pid_namespace = pid_namespace
        self.network = network
        self.user_namespace = user_namespace
        self.drops_to = drops_to
        self.reads_everything = reads_everything
        self.private_tmp = self._after_tmp is not None
        self.landlock = landlock
        self.refused: list[str] = []

    @property
    def forks(self) -> bool:
        """Whether the launcher forks the guest (``unshare --fork``: the guest is its
        child); else it execs the guest in its own place (``setpriv``, ``unshare --net``,
        no prefix at all) and the launcher's pid is the guest's."""
        return "--fork" in self.prefix

    def command(
        self, folder: str, work: str, tmp_options: str, granted: Sequence[str] = ()
    ) -> list[str]:
        """The prefix for a guest whose environment lives in ``folder`` (working in
        ``work``); with a private ``/tmp``, the mount step (`MOUNT_TMP`, tmpfs
        ``tmp_options``) in the middle, which keeps ``granted`` (the user's
        ``read_paths``) where they are under ``/tmp``."""
        if self._after_tmp is None:
            return list(self.prefix)
        sh = shutil.which("sh") or "/bin/sh"
        kept = kept_paths(folder, granted)
        return [
            *self._before_tmp,
            sh,
            "-c",
            MOUNT_TMP,
            "sh",
            tmp_options,
            work,
            str(len(kept)),
            *(_identified(path) for path in kept),
            *self._after_tmp,
        ]

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
        if ideal.private_tmp and not self.private_tmp:
            gaps.append(
                "no private /tmp (the guest cannot write /tmp, /var/tmp or /dev/shm, and "
                "its working folder is on the engine's disk, uncapped)"
                if self.landlock
                else "no private /tmp (the guest's files in /tmp, /var/tmp and /dev/shm "
                "outlive it, uncapped, and its working folder is on the engine's disk)"
            )
        if ideal.landlock and not self.landlock:
            gaps.append(
                "no Landlock (the guest can read every file its uid can: other users' "
                "world-readable files, the project, other guests' folders)"
            )
        return gaps

    def describe(self) -> str:
        """A sentence for ``isolation_report``."""
        if not self.prefix:
            alone = "no namespaces: the guest runs as the engine's user, beside it"
            if self.landlock:
                alone += f"; reads only what it is granted (Landlock ABI {self.landlock})"
            return alone
        parts = []
        if self.pid_namespace:
            parts.append("own PID namespace and /proc")
        if self.drops_to is not None:
            extra = " with CAP_DAC_READ_SEARCH" if self.reads_everything else ""
            parts.append(f"uid {self.drops_to}{extra}")
        if self.user_namespace:
            parts.append("own user namespace")
        if self.private_tmp:
            parts.append("private /tmp")
        if self.landlock:
            parts.append(f"reads only what it is granted (Landlock ABI {self.landlock})")
        parts.append("network isolated" if self.network else "host network")
        return ", ".join(parts)


def kept_paths(folder: str, granted: Sequence[str] = ()) -> list[str]:
    """What a private ``/tmp`` must not hide: ``folder`` (the environment's), and the
    interpreter, its packages and rlm_graph (with this plugin, the guest's program), and
    the ``granted`` paths, where they live under ``/tmp``, ``/var/tmp`` or ``/dev/shm``;
    outermost folders only. A source checkout is kept as its packages, never whole."""
    import rlm_graph_subprocess

    package = os.path.dirname(os.path.abspath(rlm_graph.__file__))
    source = os.path.dirname(package)
    candidates = [
        sys.prefix,
        sys.exec_prefix,
        sys.base_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        *sysconfig.get_paths().values(),
        package,
        os.path.dirname(os.path.abspath(rlm_graph_subprocess.__file__)),
        *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p),
    ]
    if not is_checkout(source):
        candidates.append(source)
    masked = [
        real
        for real in dict.fromkeys(os.path.realpath(p) for p in candidates if p)
        if _under_masked(real) and not is_checkout(real)
    ]
    # A granted path is kept as it is (a checkout too: the user named it).
    masked += [real for real in (os.path.realpath(p) for p in granted) if _under_masked(real)]
    kept: list[str] = [os.path.realpath(folder)]
    for path in sorted(set(masked)):
        if not any(path == k or path.startswith(k + "/") for k in kept):
            kept.append(path)
    return kept


def _identified(path: str) -> str:
    """``dev:inode:path`` for the mount step (``0:0:path`` for a path gone: skipped)."""
    try:
        found = os.stat(path)
    except OSError:
        return f"0:0:{path}"
    return f"{found.st_dev}:{found.st_ino}:{path}"


def _under_masked(real: str) -> bool:
    """``real`` is inside ``/tmp``, ``/var/tmp`` or ``/dev/shm`` (not one of them)."""
    return any(real.startswith(m + "/") for m in _MASKED)


def is_checkout(folder: str) -> bool:
    """Whether ``folder`` is a project's source tree (then only its packages are granted
    to a guest, never the whole tree)."""
    return any(
        os.path.exists(os.path.join(folder, name))
        for name in ("pyproject.toml", "setup.py", "setup.cfg", ".git")
    )


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


def _plans(network: bool, root: bool, landlock: int) -> list[Isolation]:
    """Every plan for this machine, strongest first."""
    net = ["--net"] if network else []
    plans = _root_plans(net) if root else _user_plans(net)
    unshare = shutil.which("unshare")
    if root and unshare and network:
        plans.append(Isolation([unshare, "--net"], network=True))
    plans.append(Isolation())
    for plan in plans:
        plan.landlock = landlock
    return plans


def _root_plans(net: list[str]) -> list[Isolation]:
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    network = bool(net)
    plans: list[Isolation] = []
    if setpriv and unshare and shutil.which("mount"):
        for own_user in (True, False):
            user = [unshare, "--user", "--map-current-user", "--"] if own_user else []
            plans.append(
                Isolation(
                    [unshare, *_PID, *net, "--"],
                    then=[*_setpriv(setpriv), *user],
                    pid_namespace=True,
                    network=network,
                    user_namespace=own_user,
                    drops_to=UNPRIVILEGED_ID,
                )
            )
    if setpriv and unshare:
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
    if setpriv:
        for everything in (False, True):
            plans.append(
                Isolation(
                    _setpriv(setpriv, everything),
                    drops_to=UNPRIVILEGED_ID,
                    reads_everything=everything,
                )
            )
    return plans


def _user_plans(net: list[str]) -> list[Isolation]:
    unshare = shutil.which("unshare")
    network = bool(net)
    plans: list[Isolation] = []
    if unshare:
        if shutil.which("mount"):
            # Root of a first user namespace mounts the tmpfs; a second one maps the
            # user back, so nothing of root (nor a capability) is left to the guest.
            ids = [f"--map-user={os.geteuid()}", f"--map-group={os.getegid()}"]
            plans.append(
                Isolation(
                    [unshare, "--user", "--map-root-user", *_PID, *net, "--"],
                    then=[unshare, "--user", *ids, "--"],
                    pid_namespace=True,
                    network=network,
                    user_namespace=True,
                )
            )
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
    return plans


def _ideal(network: bool, root: bool, user_namespace: bool = True) -> Isolation:
    return Isolation(
        ("ideal",),
        then=("tmp",),
        pid_namespace=True,
        network=network,
        user_namespace=user_namespace,
        drops_to=UNPRIVILEGED_ID if root else None,
        landlock=1,
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
        for plan in _plans(network, root, abi_version()):
            why = await _try(plan) if plan.prefix or plan.landlock else None
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
    """``None`` if the interpreter starts under ``plan``, restricts itself as a guest
    would (its Landlock ruleset), and still imports the guest's needs."""
    with tempfile.TemporaryDirectory(prefix=f"rlm-graph-{os.getpid()}-probe-") as home:
        # Root's fresh folder is closed to uid 65534; the probe must run where a guest could.
        os.chmod(home, 0o755)
        work = os.path.join(home, "work")
        os.mkdir(work, 0o777)
        os.chmod(work, 0o777)
        setup = {
            "sandbox": {
                "abi": plan.landlock,
                "write": [work, *(("/tmp",) if plan.private_tmp else ())],
                "read": [],
                "proc": plan.pid_namespace,
                "deny_tcp": False,
            },
            "probe": _REPL_DIR,
        }
        command = plan.command(home, work, "size=8m,nr_inodes=64,mode=1777,nosuid,nodev")
        try:
            result = await trio.run_process(
                [*command, sys.executable, "-P", _LANDLOCK_PROGRAM, json.dumps(setup)],
                check=False,
                capture_stdout=True,
                capture_stderr=True,
                cwd=work,
                env=guest_environ(work),
            )
        except OSError as exc:
            return str(exc)
    if result.returncode == 0:
        return None
    lines = result.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit {result.returncode}"
