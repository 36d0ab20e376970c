"""A report page's own script run under node with a stub DOM: what it draws and says,
where no Chromium is installed (tests/support/chromium.py opens it in a real one)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="no node on this machine")


def run_page_script(page: Path) -> dict[str, Any]:
    """``dag`` and ``timeline`` ([width, height] of each canvas), ``drawn`` (nodes drawn
    in each view), ``errors`` (script errors caught), ``summary`` (the line under the
    title), ``problems`` (the texts of the errors box) and ``steps`` (each step of the
    trajectory as the texts of its parts: title, label, text, label, text...)."""
    done = subprocess.run(
        ["node", str(Path(__file__).with_name("report_page.js")), str(page)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found
