"""Model code as the attacker, against the ``subprocess`` environment (black-box).

The attacks that would kill or freeze the engine when they work (signals to the engine,
reads of its ``/proc``) run in a separate engine process (``attacker.py``), with the
attacks on the boundary (a file of the user's, a schema that fetches, forged messages
on the pipe, files parked outside the limits): once as the test's own user (root in CI)
and once as uid 65534 (``setpriv``). The others run here.
The engine run as uid 65534 gets a copy of itself that it can read (`readable`): the
checkout may be in a private folder (tests/test_private_clone.py runs these tests so).
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import secrets
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from rlm_graph_subprocess.isolation import UNPRIVILEGED_ID
from rlm_graph_subprocess.process import MAX_PENDING_PROMPTS
from tests.support.guests import (
    Spy,
    engine,
    feedback,
    folder_the_guest_can_reach,
    processes_running,
    tasks_of,
)
from tests.support.listening import listening
from tests.support.readable import ReadableEngine, interpreters_for_others, probe

pytestmark = pytest.mark.processes

ATTACKER = str(Path(__file__).with_name("attacker.py"))
ROOT = Path(__file__).resolve().parents[2]
DENIED = {"PermissionError", "FileNotFoundError", "ProcessLookupError"}


@contextmanager
def planted_file() -> Iterator[Path]:
    """A file of the user's, readable by every user, that no guest was granted (beside
    the checkout, out of what a private ``/tmp`` covers, where that folder is writable)."""
    base = ROOT.parent if os.access(ROOT.parent, os.W_OK) else ROOT
    folder = Path(tempfile.mkdtemp(prefix=".rlm-graph-planted-", dir=base))
    folder.chmod(0o755)
    planted = folder / "the-users-notes.txt"
    planted.write_text("the user's private notes")
    planted.chmod(0o644)
    try:
        yield planted
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def run_attacker(
    command: list[str], extra_env: dict[str, str], attacker: str = ATTACKER
) -> dict[str, Any]:
    """Run attacker.py; return what it printed (``{"skip": ...}`` or the run's outputs)."""
    key = f"sk-test-planted-{secrets.token_hex(8)}"
    with planted_file() as planted, listening() as (url, fetched):
        env = {
            **os.environ,
            **extra_env,
            "OPENAI_API_KEY": key,
            "ATTACK_PLANTED": str(planted),
            "ATTACK_LISTENER": url,
            "ATTACK_MAX_PROCESSES": str(40 + tasks_of(UNPRIVILEGED_ID)),
        }
        with trio.fail_after(240):  # a frozen engine (SIGSTOP) fails here instead of hanging
            done = await trio.run_process(
                [*command, attacker],
                env=env,
                cwd="/",
                check=False,
                capture_stdout=True,
                capture_stderr=True,
            )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, f"the engine died ({done.returncode}): {err[-2000:]}"
    assert key not in out and key[-16:] not in out, "the guest read the planted key"
    assert fetched == [], "the engine fetched a schema reference for the guest"
    assert "the user's private notes" not in out, "the guest read the planted file"
    return dict(json.loads(out.strip().splitlines()[-1]))


def check_attacks_failed(found: dict[str, Any]) -> None:
    if "skip" in found:
        pytest.skip(found["skip"])
    assert found["response"] == "the engine is still here"
    proc, engine_signals, parent_signals, bomb, files, schema, forged, parked = (
        json.loads(re.search(r"\{.*\}", text).group())  # type: ignore[union-attr]
        for text in found["outputs"][:8]
    )
    assert proc["environ"] in DENIED and proc["mem"] in DENIED, proc
    assert proc["ppid_environ"] in DENIED | {"no parent"}, proc
    assert set(engine_signals.values()) <= DENIED, engine_signals
    assert "sent" not in parent_signals.values(), parent_signals
    # A fork bomb stops at max_processes; closing takes every process with it, also the
    # ones that left the group (setsid).
    assert bomb["stopped_by"] == "BlockingIOError" and bomb["forks"] < found["max_processes"], bomb
    assert found["leftovers"] == [], found["leftovers"]
    check_boundary_attacks_failed(found, files, schema, forged, parked)


def check_boundary_attacks_failed(
    found: dict[str, Any],
    files: dict[str, str],
    schema: dict[str, str],
    forged: dict[str, str],
    parked: dict[str, list[Any]],
) -> None:
    """The attacks on the boundary: the user's files, a schema that fetches, forged
    messages on the pipe, files parked outside the limits."""
    # A planted file outside read_paths, and a world-readable one: refused (Landlock).
    if found["landlock"]:
        assert set(files.values()) <= DENIED, files
    else:
        assert list(files.values())[0] in DENIED, files  # at least not the user's
    assert schema["ref"].startswith("[ERROR] ConfigError: schema: $ref"), schema
    # 2,000 forged calls and 12 of 4 MiB, then a real one: served in turn, never at once.
    assert forged == {"real": "sub"}, forged
    assert found["peak_calls"] <= MAX_PENDING_PROMPTS + 1, found["peak_calls"]
    # /dev/shm, /tmp, /var/tmp and the working folder: one capped tmpfs, gone after.
    if found["private_tmp"]:
        assert sum(mb for mb, _ in parked.values()) <= found["tmp_mb"], parked
        assert {why for _, why in parked.values()} == {"ENOSPC"}, parked
    assert parked_leftovers(found["parked"]) == []


def parked_leftovers(mark: str) -> list[str]:
    """Files named after ``mark`` in the host's ``/tmp``, ``/var/tmp`` and ``/dev/shm``."""
    found = []
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        for path, _dirs, files in os.walk(folder):
            found += [os.path.join(path, name) for name in files if name.startswith(mark)]
    return found


async def test_the_guest_cannot_signal_or_read_the_engine_run_by_this_user() -> None:
    check_attacks_failed(await run_attacker([sys.executable], {}))
    # The system's interpreter may get a stronger plan (one uid 65534 can reach).
    site_packages = sysconfig.get_paths()["purelib"]
    for python in interpreters()[1:]:
        found = await run_attacker(
            [python], {"ATTACK_SITE": site_packages, "PYTHONPATH": site_packages}
        )
        check_attacks_failed(found)


def interpreters() -> list[str]:
    """Interpreters of this Python version: this one first, then the system's."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = [sys.executable, shutil.which(version, path="/usr/bin:/usr/local/bin:/bin")]
    return list(dict.fromkeys(p for p in found if p))


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run the engine as uid 65534 (the test above already "
    "runs it as this unprivileged user)",
)
def test_the_guest_cannot_signal_or_read_the_engine_run_by_an_unprivileged_user() -> None:
    # A sync test (trio.run inside): a skip from a trio test loses its reason in pytest's
    # summary, and this one's says what the machine lacks.
    drop = [str(shutil.which("setpriv")), "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    # Neither this checkout nor its venv may be open to uid 65534 (a clone in a 0700
    # folder): the engine it runs gets a copy it can read, and an interpreter outside the
    # venv (uid 65534 may not reach this one's either: a pyenv under /root).
    readable = ReadableEngine([ATTACKER])
    try:
        refused = []
        for python in interpreters_for_others():
            why = probe([*drop, python], readable, ATTACKER)
            if why is not None:
                refused.append(why)
                continue
            site = str(readable.site)
            found = trio.run(
                run_attacker,
                [*drop, python],
                {"ATTACK_SITE": site, "PYTHONPATH": site},
                readable.path(ATTACKER),
            )
            if "skip" not in found:
                check_attacks_failed(found)
                return
            refused.append(f"{python}: {found['skip']}")
    finally:
        readable.remove()
    pytest.skip("uid 65534 cannot run the engine here: " + " | ".join(refused))


async def test_a_guest_flooding_its_pipe_is_killed_at_the_message_cap(spy: Spy) -> None:
    flood = (
        "import os, stat\n"
        "chunk = b'x' * (1 << 20)\n"
        "for fd in map(int, os.listdir('/proc/self/fd')):\n"
        "    try:\n"
        "        if stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
        "            for _ in range(500):\n"  # 500 MB, no newline
        "                os.write(fd, chunk)\n"
        "    except OSError:\n"
        "        pass\n"
        "FINAL('flooded')"
    )
    rlm = engine(
        [repl_of(flood), repl_of("FINAL('after')")],
        spy,
        environment_kwargs={"max_message_mb": 2, "output_cap": 10_000},
    )
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = await rlm.acompletion("ctx")
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert result.response == "after"
    told = feedback(rlm, 1)
    assert "wrote more than 2 MB to the engine's pipe" in told
    assert "variables your code made are lost" in told
    assert spy.envs[0].restarts == 1
    assert grown_mb < 100  # not the 500 MB the guest wrote


async def test_a_fork_bomb_stays_inside_max_processes(spy: Spy) -> None:
    bomb = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(120)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print(f'stopped after {n} forks: {type(exc).__name__}')"
    )
    # Without a user namespace of its own, every process of the guest's uid counts, the
    # guests of tests running beside this one too: 48 forks on top of theirs.
    limit = 48 + tasks_of(UNPRIVILEGED_ID)
    rlm = engine(
        [repl_of(bomb), repl_of("FINAL(str(n))")],
        spy,
        environment_kwargs={"max_processes": limit},
    )
    result = await rlm.acompletion("ctx")
    isolation = spy.envs[0].isolation
    if not isolation.user_namespace and isolation.drops_to is None:
        pytest.skip(f"the guest shares its uid with the engine here ({isolation.describe()})")
    assert "stopped after" in feedback(rlm, 1) and "BlockingIOError" in feedback(rlm, 1)
    assert int(result.response) < limit
    # The guest and its forks name this engine's folder on their command line (another
    # engine's guests, of a test running beside this one, do not).
    ours = f"rlm-graph-{os.getpid()}-"
    deadline = trio.current_time() + 3
    while processes_running(ours) and trio.current_time() < deadline:
        await trio.sleep(0.05)
    assert processes_running(ours) == []  # the forks went with the guest


async def test_except_exception_does_not_catch_the_cpu_stop(spy: Spy) -> None:
    spin = (
        "kept = 1\n"
        "while True:\n"
        "    try:\n"
        "        while True:\n"
        "            pass\n"
        "    except Exception:\n"
        "        continue"
    )
    rlm = engine(
        [repl_of(spin), repl_of("FINAL(f'kept={kept}')")],
        spy,
        environment_kwargs={"cpu_seconds": 1},
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "kept=1"  # stopped by its own limit: the guest lived on
    assert "CPULimitExceeded" in feedback(rlm, 1)
    assert spy.envs[0].restarts == 0


_STUBBORN = (
    "while True:\n"
    "    try:\n"
    "        while True:\n"
    "            pass\n"
    "    except BaseException:\n"
    "        continue"
)
# With SIGCHLD ignored, a child's CPU time leaves the guest's tree when it exits (never
# added to the parent's ``cutime``): the block's watch compared the total with the
# block's start, and children taking turns burned CPU for as long as they liked.
_RELAY = (
    "import os, signal, time\n"
    "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
    "for _ in range(30):\n"
    "    if os.fork() == 0:\n"
    "        start = time.process_time()\n"
    "        while time.process_time() - start < 0.6:\n"
    "            pass\n"
    "        os._exit(0)\n"
    "    time.sleep(0.7)\n"
    "print('never stopped')"
)


@pytest.mark.parametrize(
    "code", [_STUBBORN, _RELAY], ids=["except-base-exception", "children-reaped-by-the-kernel"]
)
async def test_a_block_cannot_outlive_the_cpu_limit(spy: Spy, code: str) -> None:
    rlm = engine(
        [repl_of(code), repl_of("FINAL('after')")], spy, environment_kwargs={"cpu_seconds": 1}
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "after"
    assert "kept running past its CPU limit (1 s) and its process was killed" in feedback(rlm, 1)
    assert spy.envs[0].restarts == 1


def repl_of(code: str) -> str:
    return f"```repl\n{code}\n```"


async def test_as_root_the_guest_cannot_write_the_engines_files(spy: Spy) -> None:
    # Beside the checkout, not under /tmp (a private /tmp would hide it from the guest),
    # reachable by anyone: only the write permission is in play.
    with folder_the_guest_can_reach(ROOT) as reachable:
        folder = str(reachable)
        target = Path(folder, "engine-owned.txt")
        target.write_text("intact")
        target.chmod(0o644)
        code = (
            f"print(open({str(target)!r}).read())\n"
            "try:\n"
            f"    open({str(target)!r}, 'a').write('owned')\n"
            "    print('wrote it')\n"
            "except OSError as exc:\n"
            "    print(type(exc).__name__)"
        )
        rlm = engine(
            [repl_of(code), repl_of("FINAL('done')")],
            spy,
            environment_kwargs={"read_paths": [folder]},  # readable, never writable
        )
        await rlm.acompletion("ctx")
        if spy.envs[0].isolation.drops_to is None:
            pytest.skip(f"the guest keeps the engine's user here ({spy.envs[0].isolation_report})")
        assert "intact\nPermissionError" in feedback(rlm, 1)
        assert target.read_text() == "intact"


async def test_without_namespaces_the_guest_still_runs_and_one_warning_names_what_is_missing(
    spy: Spy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from rlm_graph_subprocess import isolation

    # A machine without unshare and setpriv (an empty PATH); a fresh choice for this test.
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(isolation, "_chosen", {})
    monkeypatch.setattr(isolation, "_warned", set())
    code = f"import os\nFINAL(str(os.getppid() == int(context)) + ' ' + str(os.getuid() == {os.getuid()}))"
    with caplog.at_level(logging.INFO, logger="rlm_graph.subprocess"):
        for _ in range(2):
            rlm = engine([repl_of(code)], spy)
            assert (await rlm.acompletion(str(os.getpid()))).response == "True True"
    warnings = [r for r in caplog.records if r.name == "rlm_graph.subprocess"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "no PID namespace" in warnings[0].getMessage()
    if os.geteuid() == 0:
        assert "no unprivileged user" in warnings[0].getMessage()
    assert spy.envs[0].isolation_report.startswith("no namespaces")


async def test_the_message_cap_never_cuts_a_result_within_output_cap(spy: Spy) -> None:
    # 200,000 control characters kept: 1.2 MB of JSON escapes, past a 1 MB cap.
    rlm = engine(
        [repl_of("print('\\x01' * 300_000)"), repl_of("FINAL('after')")],
        spy,
        environment_kwargs={"max_message_mb": 1, "output_cap": 200_000},
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "after"
    assert spy.envs[0].restarts == 0
    assert "more characters were printed and not kept" in feedback(rlm, 1)


_FORGE_DONE = (
    "import gc, json, os\n"
    "proto = next(o for o in gc.get_objects() if type(o).__name__ == '_Protocol')\n"
    "forged = json.dumps({'type': 'done', 'result': {'final_answer': 'forged'}})\n"
    "os.write(proto._out.fileno(), (forged + '\\nGARBAGE\\n').encode())\n"
)


async def test_a_forged_done_and_a_stray_line_cost_the_guest_not_the_run(spy: Spy) -> None:
    """The block's code writes a ``done`` of its own and a garbled line to the engine's
    pipe: the forged ``done`` ends the block, and the engine's next data request read
    the stray line, a pydantic error that ended the run (a persistent session lost the
    answer it had). It is as bad as a dead guest: a fresh one, the data sent again."""
    rlm = engine([repl_of(_FORGE_DONE)], spy, persistent=True)
    try:
        first = await rlm.acompletion("ctx")
        assert first.response == "forged"  # the guest's own claim, as any block's answer
        again = await rlm.acompletion("ctx 2")  # the session's next completion goes on
        assert again.response == "forged"
    finally:
        await rlm.aclose()
    assert spy.envs[0].restarts >= 1


async def test_a_guest_leaving_the_engines_replies_unread_is_killed(spy: Spy) -> None:
    """The block holds the REPL's own protocol lock, so its reader thread takes no reply,
    and writes calls the engine refuses at once (10,001 prompts each, 40 KB) whose
    replies (1.3 MB each) waited for a pipe nobody read: 150 calls grew the engine by
    200 MB, linearly. Past 32 MB of replies unread the guest is killed."""
    pile_up = (
        "import gc, json, os, time\n"
        "proto = next(o for o in gc.get_objects() if type(o).__name__ == '_Protocol')\n"
        "call = {'type': 'subcall', 'id': 1, 'request': {'fn': 'llm_query_batched',\n"
        "        'prompts': [''] * 10_001, 'model': None, 'json_schema': None}}\n"
        "line = (json.dumps(call) + '\\n').encode()\n"
        "with proto._lock:\n"
        "    for _ in range(150):\n"
        "        os.write(proto._out.fileno(), line)\n"
        "    time.sleep(60)\n"
    )
    rlm = engine([repl_of(pile_up), repl_of("FINAL('after')")], spy)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = await rlm.acompletion("ctx")
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert result.response == "after"
    assert "left more than 32 MB of the engine's replies unread" in feedback(rlm, 1)
    assert spy.envs[0].restarts == 1
    assert grown_mb < 120  # not the 200 MB of replies the guest left waiting
