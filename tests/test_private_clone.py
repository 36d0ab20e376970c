"""The test command from a checkout in a private folder (mode 0700: any ``mktemp -d``,
root's home on most systems), where other users, uid 65534 among them, cannot read a
file. The attack tests run the engine as uid 65534, so they are the ones to show it."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[1]


def private_checkout() -> Path:
    """A copy of this checkout's sources and tests (as a clone has them) in a new
    ``mktemp -d`` folder, which is private (0700)."""
    folder = Path(tempfile.mkdtemp())
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    checkout = folder / "rlm-graph"
    checkout.mkdir()
    for name in ("rlm_graph", "plugins", "tests"):
        shutil.copytree(ROOT / name, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(ROOT / name, checkout / name)
    return checkout


def test_the_attack_tests_pass_from_a_checkout_in_a_0700_folder() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip(
            "needs root and setpriv: the attack test it runs starts the engine as uid 65534"
        )
    checkout = private_checkout()
    # This venv's interpreter with the private copy first on the path: the code under
    # test is the copy's, which uid 65534 cannot read.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "plugins")])}
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
                "-rA",
                "-p",
                "no:cacheprovider",
                "tests/environments/test_attacks.py",
                "-k",
                "engine_run",
            ],
            env=env,
            cwd=checkout,
            capture_output=True,
            text=True,
            timeout=540,
            check=False,
        )
    finally:
        shutil.rmtree(checkout.parent, ignore_errors=True)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-4000:]
    passed = re.findall(r"^PASSED \S+::(\S+)", report, re.MULTILINE)
    assert sorted(passed) == [
        "test_the_guest_cannot_signal_or_read_the_engine_run_by_an_unprivileged_user",
        "test_the_guest_cannot_signal_or_read_the_engine_run_by_this_user",
    ], report[-4000:]
