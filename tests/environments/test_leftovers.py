"""Nothing of a run outlives it: the ways an engine process ends (``os._exit`` right after
``completion()``, a session never closed, a stream abandoned, ``SIGKILL``) and the
scratch folders and guests each leaves. Each engine is a process of its own."""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from rlm_graph import scratch
from tests.support.guests import processes_running

pytestmark = pytest.mark.processes

ENGINE = """
import os, sys, tempfile, time
from rlm_graph import RLM
from tests.support.scripts import repl, root_and_sub

def engine(code, environment, **kwargs):
    return RLM("scripted", {{"respond": root_and_sub([repl(code)] * 3)}},
               environment=environment, **kwargs)

{body}
"""


def run_engine(body: str) -> tuple[int, str]:
    """Run an engine program (``body`` below `ENGINE`'s preamble); its pid and output."""
    source = ENGINE.format(body=textwrap.dedent(body))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    process = subprocess.Popen(
        [sys.executable, "-c", source],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    return process.pid, out


def folders_of(pid: int) -> list[str]:
    return [
        name for name in os.listdir(tempfile.gettempdir()) if name.startswith(f"rlm-graph-{pid}-")
    ]


@pytest.mark.parametrize("environment", ["local", "subprocess"])
def test_os_exit_right_after_completion_leaves_no_folder(environment: str) -> None:
    pid, out = run_engine(
        f"""
        result = engine("open('notes.txt', 'w').write('x')\\nFINAL(SCRATCH_DIR)", {environment!r})
        answer = result.completion("the document").response
        print(answer, os.path.exists(answer), flush=True)
        os._exit(0)  # no atexit: what completion() left is all there is
        """
    )
    folder, existed = out.split()
    assert existed == "False" and not os.path.exists(folder)
    assert folders_of(pid) == []


def test_a_session_never_closed_and_a_stream_abandoned_leave_nothing_at_exit() -> None:
    mark = f"{secrets.randbelow(10**6)}.4343"
    pid, out = run_engine(
        f"""
        spawn = "import subprocess\\nsubprocess.Popen(['sleep', '7{mark}'])\\nFINAL('kept')"
        session = engine(spawn, "subprocess", persistent=True)
        print(session.completion("the first document").response, flush=True)
        stream = engine("import time\\ntime.sleep(60)", "subprocess").stream("the second")
        for event in stream:
            if event.type == "node_started" and event.kind == "repl_block":
                break
        print(len([n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"rlm-graph-{{os.getpid()}}-")]))
        # and exit without closing either
        """
    )
    assert out.split()[0] == "kept"
    assert int(out.split()[1]) >= 1  # the session's folder (and the stream's) were there
    assert folders_of(pid) == []
    assert processes_running(f"7{mark}") == []


def test_an_engine_removes_the_stale_folders_of_a_killed_one() -> None:
    scratch.sweep_stale()  # others' (a start removes a few at a time): ours is then the one
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.kill()
    killed.wait()
    stale = tempfile.mkdtemp(prefix=f"rlm-graph-{killed.pid}-subprocess-d0-")
    os.mkdir(os.path.join(stale, "io"))
    with open(os.path.join(stale, "io", "context_0.txt"), "w") as handle:
        handle.write("a document of a run whose engine was killed")
    alive = tempfile.mkdtemp(prefix=f"rlm-graph-{os.getpid()}-local-")  # ours: kept
    try:
        run_engine(
            """
            print(engine("FINAL('x')", "local").completion("ctx").response)
            """
        )
        assert not os.path.exists(stale)
        assert os.path.exists(alive)
    finally:
        scratch.remove(stale)
        scratch.remove(alive)


# Model code that keeps its guest alive however its engine ends, if only the guest's own
# exit at the end of its input stood in the way: it replaces os._exit, then points the
# guest's input (the reader thread's descriptor) at a pipe of its own, which never ends.
# Whether the reader's read under way then gets the second reply or not, once the engine
# has served it the guest waits for good, its reader on that pipe or about to be.
_UNDYING = """
import fcntl, os, stat
os._exit = lambda *args: None
llm_query('first')
mine, kept = os.pipe()
for fd in range(3, 256):  # (not /proc: a guest without its own /proc cannot read it)
    try:
        if fd != mine and stat.S_ISFIFO(os.fstat(fd).st_mode):
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
                os.dup2(mine, fd)
    except OSError:
        pass
llm_query('second')
"""

_KILLED_ENGINE = """
import sys
from rlm_graph import RLM
from tests.support.scripts import repl, root_and_sub

def served(request):
    print("served", request.prompt, flush=True)
    return "ok"

RLM("scripted", {"respond": root_and_sub([repl(sys.argv[1])], served)},
    environment="subprocess").completion("ctx")
"""

# The engine's parent, a child subreaper: what the engine leaves is reparented to it and
# reaped, and it exits when nothing is left (no zombie outlives the test).
_REAPER = """
import ctypes, os, subprocess, sys
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
engine = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
print(engine.pid, flush=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
"""


def test_a_guest_whose_code_will_not_exit_dies_with_its_killed_engine() -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.Popen(
        [sys.executable, "-c", _REAPER, _KILLED_ENGINE, _UNDYING],
        cwd=root,
        stdout=subprocess.PIPE,
    )
    assert parent.stdout is not None
    out = parent.stdout.fileno()
    guests: list[int] = []  # pidfds, as the engine's and the guests' pids are recycled
    engine_pid = int(_read_until(out, b"\n", 120).split()[0])
    engine = os.pidfd_open(engine_pid)
    try:
        _read_until(out, b"served second\n", 120)  # the engine's own prints
        found = _descendants(engine_pid)
        guests = [os.pidfd_open(pid) for pid in found if b"guest.py" in _cmdline(pid)]
        assert guests, "no guest found"
        signal.pidfd_send_signal(engine, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not all(_exited(fd) for fd in guests) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_exited(fd) for fd in guests)  # before: alive, as uid 65534, for good
        assert parent.wait(timeout=60) == 0  # and nothing else of the engine's is left
    finally:
        for fd in [engine, *guests]:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        try:
            parent.wait(timeout=30)  # what is left reaped
        except subprocess.TimeoutExpired:
            parent.kill()
            parent.wait()
        parent.stdout.close()


def _read_until(fd: int, marker: bytes, seconds: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + seconds
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0 and select.select([fd], [], [], left)[0], seen[-2000:]
        chunk = os.read(fd, 1)  # no further than the marker: what follows stays unread
        assert chunk, f"the engine ended first: {seen[-2000:]!r}"
        seen += chunk
    return seen


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                parents[int(entry)] = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


def test_a_folder_whose_owner_is_a_zombie_is_stale() -> None:
    # A process that has exited but that its parent has not reaped yet (a Ray worker
    # just killed, before the raylet waits for it) still answers kill(pid, 0).
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while not _is_zombie(zombie.pid):
            time.sleep(0.01)
        folder = tempfile.mkdtemp(prefix=f"rlm-graph-{zombie.pid}-local-")
        found = scratch.sweep_stale(os.path.dirname(folder))
        assert folder in found and not os.path.exists(folder)
    finally:
        zombie.wait()


def _is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"


def test_a_stale_folder_is_found_whatever_its_random_part() -> None:
    # mkdtemp's random part may hold "_" (one name in five): such folders were never swept.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = tempfile.mkdtemp(prefix=f"rlm-graph-{dead.pid}-local-", suffix="_x")
    try:
        assert folder in scratch.sweep_stale(os.path.dirname(folder))
    finally:
        scratch.remove(folder)


_LOCKED_WITH_A_LINK = """
import os, stat, sys
from rlm_graph import scratch
base = sys.argv[1]
victim = os.path.join(base, "victim.txt")  # any file of the engine's user
open(victim, "w").write("x")
os.chmod(victim, 0o644)
folder = os.path.join(base, "rlm-folder")  # a guest's working folder
locked = os.path.join(folder, "d")
os.makedirs(locked)
os.symlink(victim, os.path.join(locked, "link"))  # planted by the guest...
os.chmod(locked, int(sys.argv[2], 8))  # ...which then takes its rights away from its folder
scratch.remove(folder)
print(os.path.exists(folder), oct(stat.S_IMODE(os.stat(victim).st_mode)))
"""


@pytest.mark.parametrize("mode", ["500", "300", "000"])
def test_removing_a_guests_locked_folder_never_changes_a_file_its_links_name(
    tmp_path: os.PathLike[str], mode: str
) -> None:
    """A folder whose writer took its own rights away is opened up again to be removed:
    that chmod followed a link the guest planted in it, making any file of the engine's
    user 0700 (and a folder of mode 000 must still go). Run without the rights that let
    root unlink anyway (as the engine runs when it is not root)."""
    command = [sys.executable, "-c", _LOCKED_WITH_A_LINK, str(tmp_path), mode]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv to drop root's right to unlink in a locked folder")
        drop = "-dac_override,-dac_read_search,-fowner"
        command = ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["False", "0o644"], done.stderr


def test_a_forked_child_that_exits_leaves_its_parents_guests_running() -> None:
    """A forked engine's child inherited the parent's list of live guests and killed them
    at its own exit: the parent's persistent session died with the child."""
    _, out = run_engine(
        """
        session = engine("x = globals().get('x', 40) + 1\\nFINAL(str(x))", "subprocess",
                         persistent=True)
        print(session.completion("ctx").response, flush=True)
        child = os.fork()
        if child == 0:
            engine("FINAL('child')", "subprocess").completion("c")
            sys.exit(0)  # a normal exit: its atexit handlers run
        os.waitpid(child, 0)
        print(session.completion("again").response, flush=True)
        session.close()
        """
    )
    assert out.split() == ["41", "42"]  # the same REPL, alive


def test_without_pidfds_there_is_no_watcher_and_the_engine_says_so_once() -> None:
    """Where pidfd_open is missing (macOS) the watcher's set-up raised: every guest's
    start failed, leaving the guest it had just spawned running. Now guests start, no
    watcher is made, and a warning says once what that leaves unguarded."""
    _, out = run_engine(
        """
        import logging
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
        del os.pidfd_open
        from rlm_graph_subprocess import reaper
        for n in range(2):
            print(engine(f"FINAL('run {n}')", "subprocess").completion("c").response)
        print("watcher:", reaper._watcher)
        """
    )
    assert "run 0" in out and "run 1" in out and "watcher: None" in out
    assert out.count("no watcher for the subprocess guests: this platform has no pidfd_open") == 1


def test_a_watcher_that_cannot_be_noted_never_fails_a_guests_start() -> None:
    _, out = run_engine(
        """
        from rlm_graph_subprocess import reaper
        def broken():
            raise OSError(24, "Too many open files")
        reaper._ensure_watcher = broken
        print(engine("FINAL('still runs')", "subprocess").completion("c").response)
        """
    )
    assert out.split() == ["still", "runs"]


def test_a_persistent_session_whose_repl_fails_to_start_leaves_no_folder() -> None:
    """A session whose REPL failed (or was cancelled) as it started left its scratch
    folder until the interpreter exited, one per failed completion."""
    pid, out = run_engine(
        """
        session = engine("FINAL('x')", "subprocess", persistent=True,
                         environment_kwargs={"start_timeout": 0.001})
        for _ in range(3):
            try:
                session.completion("the document")
            except Exception as exc:
                print(type(exc).__name__, flush=True)
        print(len([n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"rlm-graph-{os.getpid()}-")]), flush=True)
        session.close()
        """
    )
    *failures, left = out.split()
    assert failures == ["EnvironmentCrashed"] * 3
    assert left == "0"  # gone before the exit, not only at it


_SWAPPED_FOR_A_LINK = """
import os, sys
from rlm_graph import scratch
base = sys.argv[1]
victim = os.path.join(base, "victim")  # a folder of the engine's user the guest cannot write
os.makedirs(os.path.join(victim, "ssl"))
open(os.path.join(victim, "ssl", "roots.pem"), "w").write("the user's")
folder = os.path.join(base, "rlm-folder")
work = os.path.join(folder, "work")
os.makedirs(os.path.join(work, "a", "ssl"))
for n in range(50):
    open(os.path.join(work, "a", "ssl", f"f{n}"), "w").close()
unlink, swapped = os.unlink, []

def unlink_then_swap(name, *args, **kwargs):
    # A process the guest left running, once the removal of a/ssl is under way: a
    # becomes a2, a link to the victim takes its name, and a2/ssl gets files again.
    unlink(name, *args, **kwargs)
    if name.startswith("f") and not swapped:
        swapped.append(name)
        os.rename(os.path.join(work, "a"), os.path.join(work, "a2"))
        os.symlink(victim, os.path.join(work, "a"))
        for n in range(3):
            open(os.path.join(work, "a2", "ssl", f"late{n}"), "w").close()

os.unlink = unlink_then_swap
scratch.remove(folder)
ssl = os.path.join(victim, "ssl")
kept = os.listdir(ssl) if os.path.isdir(ssl) else "gone"
print(bool(swapped), os.path.lexists(folder), kept, oct(os.stat(victim).st_mode & 0o777))
"""


def test_a_folder_swapped_for_a_link_as_it_is_emptied_never_leads_the_removal_out(
    tmp_path: os.PathLike[str],
) -> None:
    """A process of the guest that outlived it (no PID namespace ended it) renamed a
    folder being emptied and put a link to a folder of the engine's user in its place:
    the removal, retried by path, went through the link, and emptied that folder (and
    made it 0700). Now nothing below the scratch folder is reached by a path."""
    command = [sys.executable, "-c", _SWAPPED_FOR_A_LINK, str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.split() == ["True", "False", "['roots.pem']", "0o755"], done.stderr


_DEEP = """
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))  # a depth cap of 8 folders
from rlm_graph import scratch

listings = 0
names = scratch._names


def counted(fd):
    global listings
    listings += 1
    return names(fd)


scratch._names = counted
root = sys.argv[1]
fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
for _ in range(80):  # deeper than the cap and than the open files, as a guest can make
    os.mkdir("d", dir_fd=fd)
    inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = inner
os.close(fd)
scratch._remove_tree(os.path.join(root, "d"))
print(listings, os.path.isdir(os.path.join(root, "d")))
"""


def test_a_tree_deeper_than_the_removal_goes_is_left_in_few_steps(tmp_path: Path) -> None:
    """A guest's chain of folders deeper than the removal may hold descriptors for: the
    part past the cap is left (logged), and each folder above is listed once, not again
    and again (each level listed its whole subtree three times: 3^depth, a removal, and
    so ``completion()``, that never ended), holding at most an eighth of the process's
    open files (it held one a level, until the engine had none left)."""
    done = subprocess.run(
        [sys.executable, "-c", _DEEP, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    listings, left = done.stdout.split()
    assert left == "True" and int(listings) <= 8 * 2, done.stdout  # once a level
    assert "could not be removed whole" in done.stderr
