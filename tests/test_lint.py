"""The house's lint and format rules (ruff, configured in pyproject.toml) hold everywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_ruff_check_is_clean() -> None:
    done = _ruff("check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_leaves_every_file_as_it_is() -> None:
    done = _ruff("format", "--check", ".")
    assert done.returncode == 0, done.stdout + done.stderr
