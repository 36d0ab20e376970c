"""Model code as the attacker against the guest's file system: what it may write (a
private, capped ``/tmp``), what it may read (its runtime, its folders, ``read_paths``)
and what outlives it (nothing). Real guest processes, the scripted provider."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from rlm_graph_subprocess import SubprocessEnvironment
from tests.support.guests import HOST_TMP, Spy, engine, feedback, folder_the_guest_can_reach
from tests.support.scripts import repl

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A fresh folder, open to every user, in none of the folders a private ``/tmp``
    covers (beside the checkout: the guest must not read it unless granted)."""
    with folder_the_guest_can_reach(ROOT) as folder:
        yield folder


def leftovers(marker: str) -> list[str]:
    found = []
    for folder in HOST_TMP:
        for path, _dirs, files in os.walk(folder):
            found += [os.path.join(path, name) for name in files if marker in name]
    return found


PARK = """
import errno, os
parked = {{}}
for folder in ('/dev/shm', '/tmp', '/var/tmp'):
    written = 0
    try:
        with open(os.path.join(folder, '{marker}-' + folder.strip('/').replace('/', '-')), 'wb') as handle:
            while written < 600 * 2**20:
                handle.write(b'x' * 2**20)
                handle.flush()
                written += 2**20
    except OSError as exc:
        parked[folder] = (written >> 20, errno.errorcode.get(exc.errno, '?'))
    else:
        parked[folder] = (written >> 20, 'no error')
print(parked)
"""


async def test_the_guest_parks_nothing_outside_its_memory_and_nothing_outlives_it(
    spy: Spy,
) -> None:
    marker = f"park-{secrets.token_hex(4)}"
    rlm = engine(
        [repl(PARK.format(marker=marker)), repl("FINAL('done')")],
        spy,
        environment_kwargs={"memory_limit_mb": 256},
    )
    assert (await rlm.acompletion("ctx")).response == "done"
    env = spy.envs[0]
    if not env.isolation.private_tmp and not env.isolation.landlock:
        pytest.skip(f"no private /tmp and no Landlock here ({env.isolation_report})")
    parked = eval(feedback(rlm, 1).split("REPL output:\n", 1)[1].split("\n\n", 1)[0])
    # One tmpfs behind the three folders: together at most its size (a quarter of 256
    # MB), and none at all where Landlock alone keeps them closed.
    assert sum(mb for mb, _ in parked.values()) <= env.limits.tmp_mb, parked
    assert {why for _, why in parked.values()} <= {"ENOSPC", "EACCES"}, parked
    assert leftovers(marker) == []


async def test_the_guest_cannot_create_more_files_than_max_files(spy: Spy) -> None:
    code = (
        "n = 0\n"
        "try:\n"
        "    while n < 100_000:\n"
        "        open(f'/tmp/f{n}', 'w').close()\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print(n, type(exc).__name__)"
    )
    rlm = engine([repl(code), repl("FINAL('done')")], spy, environment_kwargs={"max_files": 200})
    await rlm.acompletion("ctx")
    if not spy.envs[0].isolation.private_tmp:
        pytest.skip(f"no private /tmp here ({spy.envs[0].isolation_report})")
    created, error = feedback(rlm, 1).split("REPL output:\n", 1)[1].split()[:2]
    assert 100 < int(created) < 200 and error == "OSError"


FILL = """
import errno, json, os
def fill(write, most):
    done = 0
    try:
        while done < most:
            write(done)
            done += 1
    except OSError as exc:
        return done, errno.errorcode.get(exc.errno, '?')
    return done, 'no error'
def chunk(n):
    with open('big', 'ab') as handle:
        handle.write(b'x' * 2**20)
mb = fill(chunk, 400)
os.remove('big')
files = fill(lambda n: open(f'f{n}', 'w').close(), 4000)
print(json.dumps({'mb': mb, 'files': files, 'here': os.getcwd()}))
"""


async def test_the_working_folder_is_capped_with_the_private_tmp_and_not_on_the_engines_disk() -> (
    None
):
    # Before, the guest's working folder was the engine's: 4,000 files and 300 MB under
    # memory_limit_mb=256 and max_files=200.
    bridge: Any = None
    env = SubprocessEnvironment(bridge=bridge, memory_limit_mb=256, max_files=200)
    try:
        await env.start()
        if not env.isolation.private_tmp:
            pytest.skip(f"no private /tmp here ({env.isolation_report})")
        result = await env.execute(FILL)
        import json

        filled = json.loads(result.stdout)
        assert filled["here"] == env.workdir  # where SCRATCH_DIR is, as before
        assert filled["mb"][0] <= env.limits.tmp_mb and filled["mb"][1] == "ENOSPC", filled
        assert filled["files"][0] < 200 and filled["files"][1] == "ENOSPC", filled
        assert os.listdir(env.workdir) == []  # nothing of it on the engine's disk
    finally:
        await env.aclose()


READ = """
import json
seen = {{}}
for path in {paths!r}:
    try:
        with open(path) as handle:
            seen[path] = handle.read()[:40]
    except OSError as exc:
        seen[path] = type(exc).__name__
print(json.dumps(seen))
"""


async def test_the_guest_reads_only_its_runtime_its_folder_and_the_granted_paths(
    spy: Spy, outside_tmp: Path
) -> None:
    secret = outside_tmp / "secret.txt"
    secret.write_text("a user's file")
    granted = outside_tmp / "granted"
    granted.mkdir()
    (granted / "notes.txt").write_text("granted notes")
    for path in (secret, granted / "notes.txt"):
        path.chmod(0o644)
    granted.chmod(0o755)
    paths = ["/etc/passwd", str(ROOT / "pyproject.toml"), str(secret), str(granted / "notes.txt")]
    rlm = engine(
        [repl(READ.format(paths=paths) + "import numbers, decimal, fractions"), repl("FINAL('x')")],
        spy,
        environment_kwargs={"read_paths": [str(granted)]},
    )
    await rlm.acompletion("ctx")
    env = spy.envs[0]
    if not env.isolation.landlock:
        pytest.skip(f"no Landlock here ({env.isolation_report})")
    told = feedback(rlm, 1)
    assert "Error" not in told.split("}", 1)[1], told  # the standard library still imports
    import json

    seen = json.loads(told.split("REPL output:\n", 1)[1].split("\n", 1)[0])
    assert seen[str(granted / "notes.txt")] == "granted notes"
    for path in paths[:3]:
        assert seen[path] in {"PermissionError", "FileNotFoundError"}, (path, seen)


async def test_paths_granted_under_tmp_are_read_there_read_only_and_nothing_beside_them(
    spy: Spy,
) -> None:
    """The guest's ``/tmp`` is its own, but a granted folder or file that lives under the
    host's ``/tmp`` (pytest's and ``mktemp``'s folders do) is at its own path in it."""
    base = Path(tempfile.mkdtemp(prefix="rlm-graph-grant-"))
    try:
        base.chmod(0o755)
        folder, single, beside = base / "folder", base / "single.txt", base / "beside.txt"
        folder.mkdir(mode=0o755)
        (folder / "notes.txt").write_text("granted notes")
        single.write_text("a granted file")
        beside.write_text("not granted")
        for path in (folder / "notes.txt", single, beside):
            path.chmod(0o644)
        code = READ.format(paths=[str(folder / "notes.txt"), str(single), str(beside)])
        code += f"\ntry:\n    open({str(single)!r}, 'a').write('x')\nexcept OSError as exc:\n"
        code += "    print(type(exc).__name__)\n"
        rlm = engine(
            [repl(code), repl("FINAL('x')")],
            spy,
            environment_kwargs={"read_paths": [str(folder), str(single)]},
        )
        await rlm.acompletion("ctx")
        env = spy.envs[0]
        if not env.isolation.private_tmp:
            pytest.skip(f"no private /tmp here ({env.isolation_report})")
        told = feedback(rlm, 1).split("REPL output:\n", 1)[1]
        import json

        seen = json.loads(told.split("\n", 1)[0])
        assert seen[str(folder / "notes.txt")] == "granted notes"
        assert seen[str(single)] == "a granted file"
        assert seen[str(beside)] in {"PermissionError", "FileNotFoundError"}
        assert told.split("\n")[1] in {"OSError", "PermissionError"}  # read-only
        assert single.read_text() == "a granted file"
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_a_granted_path_gone_before_a_restart_leaves_the_guest_running(
    spy: Spy,
) -> None:
    """A granted folder under /tmp removed while the run goes, then a guest that dies
    and is started again: the new guest starts without it (the run goes on), and a
    granted FIFO is not bound at all (the guest may write /tmp)."""
    from tests.support.scripts import turn_number

    base = Path(tempfile.mkdtemp(prefix="rlm-graph-grant-"))
    base.chmod(0o755)
    granted, fifo = base / "granted", base / "pipe"
    granted.mkdir(mode=0o755)
    os.mkfifo(fifo, 0o666)
    try:
        probe = f"import os\nprint(os.path.exists({str(granted)!r}), os.path.exists({str(fifo)!r}))"

        def root(request: Any) -> str:
            turn = turn_number(request)
            if turn == 1:
                return repl(probe)
            if turn == 2:
                shutil.rmtree(granted)  # gone before the guest's restart
                return repl("import os\nos._exit(3)")
            if turn == 3:
                return repl(probe)
            return repl("FINAL('alive')")

        rlm = engine(root, spy, environment_kwargs={"read_paths": [str(granted), str(fifo)]})
        result = await rlm.acompletion("ctx")
        if not spy.envs[0].isolation.private_tmp:
            pytest.skip(f"no private /tmp here ({spy.envs[0].isolation_report})")
        assert result.response == "alive"
        assert "True False" in feedback(rlm, 1)  # the folder bound, the FIFO not
        assert "False False" in feedback(rlm, 3)  # the restarted guest, without it
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_a_granted_path_that_is_not_the_file_the_engine_found_is_not_bound(
    spy: Spy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the engine finding a granted path and the mount step binding it (as root),
    a host user who controls a folder on the way could swap in a symlink to any file:
    the mount step binds only the file the engine found (its device and inode). The swap
    is played here by the engine recording another inode than the path has."""
    from rlm_graph_subprocess import isolation

    base = Path(tempfile.mkdtemp(prefix="rlm-graph-grant-"))
    base.chmod(0o755)
    granted = base / "granted"
    granted.mkdir(mode=0o755)
    (granted / "notes.txt").write_text("granted notes")
    (granted / "notes.txt").chmod(0o644)
    found = isolation._identified

    def swapped(path: str) -> str:
        if path != str(granted):
            return found(path)
        dev, ino, rest = found(path).split(":", 2)
        return f"{dev}:{int(ino) + 1}:{rest}"  # what the engine saw is not there now

    monkeypatch.setattr(isolation, "_identified", swapped)
    try:
        paths = [str(granted / "notes.txt")]
        rlm = engine(
            [repl(READ.format(paths=paths)), repl("FINAL('x')")],
            spy,
            environment_kwargs={"read_paths": [str(granted)]},
        )
        await rlm.acompletion("ctx")
        if not spy.envs[0].isolation.private_tmp:
            pytest.skip(f"no private /tmp here ({spy.envs[0].isolation_report})")
        import json

        told = feedback(rlm, 1).split("REPL output:\n", 1)[1]
        seen = json.loads(told.split("\n", 1)[0])  # the guest ran: its folder was bound
        assert seen[paths[0]] in {"PermissionError", "FileNotFoundError"}
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_the_guest_starts_in_its_working_folder_on_its_private_tmp(spy: Spy) -> None:
    """A relative path is in the guest's working folder as mounted on its tmpfs (not the
    engine's folder underneath it): a file written there is the guest's, not on disk."""
    # A child process resolves its relative paths by the process's own working folder.
    code = (
        "open('rel.txt', 'w').write('mine')\nimport os, subprocess\n"
        "child = subprocess.run(['sh', '-c', 'echo sub > rel2.txt && cat rel2.txt'],"
        " capture_output=True, text=True)\n"
        "print(open('rel.txt').read(), os.getcwd(), child.stdout.strip() or child.stderr.strip())"
    )
    rlm = engine([repl(code), repl("FINAL('x')")], spy)
    await rlm.acompletion("ctx")
    env = spy.envs[0]
    if not env.isolation.private_tmp:
        pytest.skip(f"no private /tmp here ({env.isolation_report})")
    told = feedback(rlm, 1).split("REPL output:\n", 1)[1]
    assert told.startswith(f"mine {env.workdir} sub"), told
    for name in ("rel.txt", "rel2.txt"):  # not on the engine's disk
        assert not os.path.exists(os.path.join(env.workdir, name))


async def test_concurrent_guests_cannot_read_each_others_folders() -> None:
    bridge: Any = None
    first, second = (SubprocessEnvironment(bridge=bridge) for _ in range(2))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.start)
            nursery.start_soon(second.start)
        await first.add_context("the first guest's document", 0)
        done = await first.execute("open('mine.txt', 'w').write('the first guest notes')")
        assert done.error is None, done
        if not first.isolation.landlock and not first.isolation.private_tmp:
            pytest.skip(f"no Landlock and no private /tmp here ({first.isolation_report})")
        targets = [
            os.path.join(first.workdir, "mine.txt"),
            os.path.join(os.path.dirname(first.workdir), "io", "context_0.txt"),
        ]
        result = await second.execute(READ.format(paths=targets))
        import json

        seen = json.loads(result.stdout)
        assert set(seen.values()) <= {"PermissionError", "FileNotFoundError"}, seen
    finally:
        await first.aclose()
        await second.aclose()
