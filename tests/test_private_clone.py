"""The test command from a checkout in a private folder (mode 0700: any ``mktemp -d``,
root's home on most systems), where other users, uid 65534 among them, cannot read a
file. The guest tests (the attacks, the guest's file system) run guests as uid 65534,
and two of them the engine too, so they are the ones to show it: all of them run from
such a copy, and pass, or skip naming why."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from xml.etree import ElementTree

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[1]


def private_checkout() -> Path:
    """A copy of this checkout's sources and tests (as a clone has them) in a new
    private folder (0700, as ``mktemp -d`` makes them): beside this checkout where it
    can (as a clone in root's home is, outside ``/tmp``), else under ``/tmp``."""
    base = ROOT.parent if os.access(ROOT.parent, os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix=".rlm-graph-private-", dir=base))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    checkout = folder / "rlm-graph"
    checkout.mkdir()
    for name in ("rlm_graph", "plugins", "tests"):
        shutil.copytree(ROOT / name, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(ROOT / name, checkout / name)
    return checkout


def private_folder_above(path: Path) -> str | None:
    """The first folder at or above ``path`` that other users cannot enter (as
    ``folder (mode 700)``), or None."""
    for folder in [path, *path.parents]:
        mode = stat.S_IMODE(folder.stat().st_mode)
        if not mode & stat.S_IXOTH:
            return f"{folder} (mode {mode:o})"
    return None


# The guest tests whose fixture needs a folder beside the checkout that uid 65534 can
# enter: from a 0700 folder there is none, and they say so (tests/support/guests.py).
NEED_A_REACHABLE_FOLDER = {
    "test_as_root_the_guest_cannot_write_the_engines_files",
    "test_the_guest_reads_only_its_runtime_its_folder_and_the_granted_paths",
}
UNREACHABLE = "no folder beside the checkout that the guest can reach"
GUEST_TESTS = ("tests/environments/test_attacks.py", "tests/environments/test_guest_files.py")


def outcomes(junit: Path) -> dict[str, str]:
    """Test name -> "passed", "failed: ..." or "skipped: <reason>", from a JUnit report."""
    found = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "").split("[")[0]
        problems = [child for child in case if child.tag in ("failure", "error", "skipped")]
        if not problems:
            found[name] = "passed"
        else:
            tag, message = problems[0].tag, problems[0].get("message", "")
            found[name] = f"{tag}: {message}"
    return found


def test_the_guest_tests_pass_from_a_checkout_in_a_0700_folder() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip(
            "needs root and setpriv: the attack test it runs starts the engine as uid 65534"
        )
    private = private_folder_above(ROOT)
    if private is not None:
        pytest.skip(
            f"this checkout is itself in a private folder ({private}): the guest tests ran "
            "from it in this same run, and a copy would only run them again"
        )
    checkout = private_checkout()
    # This venv's interpreter with the private copy first on the path: the code under
    # test is the copy's, which uid 65534 cannot read.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "plugins")])}
    junit = checkout / "guest-tests.xml"
    try:
        where = subprocess.run(
            [
                sys.executable,
                "-c",
                "import rlm_graph, rlm_graph_subprocess as s; print(rlm_graph.__file__, s.__file__)",
            ],
            env=env,
            cwd=checkout,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert all(path.startswith(str(checkout)) for path in where.stdout.split()), where.stdout
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={junit}",
                *GUEST_TESTS,
            ],
            env=env,
            cwd=checkout,
            capture_output=True,
            text=True,
            timeout=540,
            check=False,
        )
        found = outcomes(junit) if junit.exists() else {}
    finally:
        shutil.rmtree(checkout.parent, ignore_errors=True)
    report = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, report
    expected = {
        name
        for test in GUEST_TESTS
        for name in re.findall(r"^(?:async )?def (test_\w+)", (ROOT / test).read_text(), re.M)
    }
    assert set(found) == expected, report  # every test of the two files ran
    # The engine run as uid 65534 from the private copy: the reason this test exists.
    for name in (
        "test_the_guest_cannot_signal_or_read_the_engine_run_by_an_unprivileged_user",
        "test_the_guest_cannot_signal_or_read_the_engine_run_by_this_user",
    ):
        assert found[name] == "passed", (name, found[name])
    for name in NEED_A_REACHABLE_FOLDER:
        assert found[name].startswith(f"skipped: {UNREACHABLE}"), (name, found[name])
        assert "is private (mode 700)" in found[name] or "under /tmp" in found[name]
    # Any other skip names its reason (a kernel without Landlock, say); none is silent.
    for name, outcome in found.items():
        assert (
            outcome == "passed"
            or name in NEED_A_REACHABLE_FOLDER
            or (outcome.startswith("skipped: ") and len(outcome) > len("skipped: ") + 10)
        ), (name, outcome)
