"""Opening a page in a real headless Chromium (Debian's ``chromium`` package), for the
tests of the reports: the run report (tests/report) and the evaluation report
(tests/eval)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["CHROMIUM", "dump_in_chromium", "needs_chromium", "open_in_chromium"]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("CI"):
    raise RuntimeError(
        "CI must have chromium for the report's browser tests: `make test` installs it"
    )
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on this machine (`make test` installs Debian's package when missing)",
)


def open_in_chromium(
    page: Path, tmp_path: Path, fragment: str = ""
) -> tuple[dict[str, str], list[str]]:
    """Load ``page`` in headless Chromium; return <body>'s attributes once the page's
    script has run, and the console messages (errors included) it logged."""
    attributes, console, _ = dump_in_chromium(page, tmp_path, fragment)
    return attributes, console


def dump_in_chromium(
    page: Path, tmp_path: Path, fragment: str = ""
) -> tuple[dict[str, str], list[str], str]:
    """`open_in_chromium`, and the whole DOM as the page's script left it (HTML)."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            page.resolve().as_uri() + fragment,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", done.stdout)
    assert body is not None, done.stdout[:500]
    attributes = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return attributes, console, done.stdout
