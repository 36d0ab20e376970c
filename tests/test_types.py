"""Strict mypy over rlm_graph/ and plugins/ (the house rule): a type error fails the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.mypy

ROOT = Path(__file__).resolve().parents[1]


def test_strict_mypy_is_clean() -> None:
    # mypy's own cache (.mypy_cache, ignored by git) is kept between runs: a re-run
    # checks only what changed.
    done = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
