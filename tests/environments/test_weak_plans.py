"""The weaker plans a machine that refuses namespaces falls back to (`isolation`), for
real: ``setpriv`` alone (root), ``unshare --net`` alone. Their launcher execs the guest
in its own place (no fork, no PID namespace): the engine must still know the guest's
pid to watch its CPU, and a process the guest leaves running outlives it. Each test
makes the machine offer one tool only (a ``PATH`` holding it alone) and a fresh choice."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from rlm_graph_subprocess import SubprocessEnvironment, isolation
from tests.support.guests import Spy, alive, engine, feedback

pytestmark = pytest.mark.processes


def repl(code: str) -> str:
    return f"```repl\n{code}\n```"


@pytest.fixture(params=["setpriv", "unshare"])
def weak_plan(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A machine whose only launcher is ``setpriv`` (root: ``setpriv`` to 65534 alone)
    or ``unshare`` (``unshare --net`` alone, for root as for a user)."""
    tool: str = request.param
    found = shutil.which(tool)
    if found is None:
        pytest.skip(f"no {tool} on this machine")
    if tool == "setpriv" and os.geteuid() != 0:
        pytest.skip("the setpriv plan is root's")
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.setattr(isolation, "_chosen", {})
    monkeypatch.setattr(isolation, "_warned", set())
    yield tool


def require_the_plan(env: SubprocessEnvironment, tool: str) -> None:
    if not env.isolation.prefix or not env.isolation.prefix[0].endswith(tool):
        pytest.skip(f"this machine refuses {tool}: {env.isolation.refused}")
    assert not env.isolation.pid_namespace


_STUBBORN = (
    "import time\n"
    "start = time.process_time()\n"
    "while time.process_time() - start < 20:\n"
    "    try:\n"
    "        while time.process_time() - start < 20:\n"
    "            pass\n"
    "    except BaseException:\n"
    "        continue\n"
    "print('never stopped')"
)


async def test_a_block_behind_a_launcher_that_execs_the_guest_is_held_to_its_cpu_seconds(
    spy: Spy, weak_plan: str
) -> None:
    """The engine looked for the guest among its launcher's children: there is none when
    the launcher execs it in place, so no pid, and no CPU watch: a block catching
    ``CPULimitExceeded`` in a loop ran 25 CPU seconds with ``cpu_seconds=3``."""
    rlm = engine(
        [repl("import os\nprint(os.getpid())"), repl(_STUBBORN), repl("FINAL('after')")],
        spy,
        environment_kwargs={"cpu_seconds": 1},
    )
    result = await rlm.acompletion("ctx")
    env = spy.envs[0]
    require_the_plan(env, weak_plan)
    assert result.response == "after"
    assert "kept running past its CPU limit (1 s) and its process was killed" in feedback(rlm, 2)
    assert env.restarts == 1
    printed = int(feedback(rlm, 1).split("REPL output:\n")[1].split()[0])
    assert env.guest_pids[:1] == [printed]  # the guest's pid is the launcher's


async def test_cpu_left_running_behind_a_launcher_that_execs_the_guest_is_stopped(
    weak_plan: str,
) -> None:
    env = SubprocessEnvironment(bridge=None, cpu_seconds=1)  # type: ignore[arg-type]
    try:
        await env.start()
        require_the_plan(env, weak_plan)
        spin = "import threading\nthreading.Thread(target=lambda: exec('while True: pass')).start()"
        assert (await env.execute(spin)).error is None
        assert env.guest_pids, "the guest's pid is unknown: nothing watches its CPU"
        first = env.guest_pids[0]
        with trio.fail_after(60):  # no block runs: the idle watch alone stops it
            while alive(first):
                await trio.sleep(0.1)
        result = await env.execute("print('fresh')")
        assert "left running kept using CPU with no block running" in result.stderr
    finally:
        await env.aclose()


_SWAP_AS_REMOVED = """
import os
N = 5000
os.makedirs('a/ssl')
for i in range(N):
    open(f'a/ssl/f{i}', 'w').close()
daemon = '''
import os, time
work, victim = WORK, VICTIM
deadline = time.time() + 60
while time.time() < deadline:
    try:
        n = len(os.listdir(work + '/a/ssl'))
    except OSError:
        break
    if n < N:  # the engine is emptying a/ssl: a becomes a2, a link to the victim a
        os.rename(work + '/a', work + '/a2')
        os.symlink(victim, work + '/a')
        for i in range(20):
            open(work + f'/a2/ssl/late{i}', 'w').close()
        break
'''.replace('WORK', repr(os.getcwd())).replace('VICTIM', repr(context)).replace('N:', f'{N}:')
pid = os.fork()
if pid == 0:
    os.setsid()  # out of the group the engine kills: no PID namespace takes it
    try:
        exec(daemon, {})
    finally:
        os._exit(0)
print('daemon', pid)
"""


async def test_a_process_the_guest_left_cannot_turn_the_removal_of_its_folder_outward(
    spy: Spy, tmp_path: Path, weak_plan: str
) -> None:
    """``setpriv`` alone, the engine root: a process the guest forked into a session of
    its own outlives it, waits for the engine to start emptying ``a/ssl``, renames
    ``a`` and puts a link to a folder of root's in its place: the removal's retry went
    through the link and emptied root's folder."""
    if weak_plan != "setpriv":
        pytest.skip("under unshare alone the guest is root: it could remove the folder itself")
    victim = tmp_path / "victim"
    (victim / "ssl").mkdir(parents=True)
    (victim / "ssl" / "roots.pem").write_text("root's")
    rlm = engine([repl(_SWAP_AS_REMOVED), repl("FINAL('done')")], spy)
    daemon = None
    try:
        assert (await rlm.acompletion(str(victim))).response == "done"
        require_the_plan(spy.envs[0], weak_plan)
        daemon = int(feedback(rlm, 1).split("daemon ")[1].split()[0])
        with trio.fail_after(60):
            while alive(daemon):
                await trio.sleep(0.1)
        assert [p.name for p in (victim / "ssl").iterdir()] == ["roots.pem"]
        assert oct((victim / "ssl").stat().st_mode & 0o777) == "0o755"
    finally:
        if daemon is not None and alive(daemon):
            with contextlib.suppress(ProcessLookupError):
                os.kill(daemon, signal.SIGKILL)
