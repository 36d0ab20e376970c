"""The documentation site: ``mkdocs build --strict`` over docs/ (mkdocs.yml), where a
broken link, a missing anchor or a page left out of the nav fails the build. It needs no
network: where this user may make a network namespace, the build runs in one that has
none."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mkdocs", reason="the docs extra (pip install 'rlm-graph[docs]')")
pytest.importorskip("material", reason="the docs extra (pip install 'rlm-graph[docs]')")


def without_network() -> list[str]:
    """A command prefix that cuts the network (``unshare --net``), if this user may."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    probe = subprocess.run([unshare, "--net", "true"], capture_output=True, check=False)
    return [unshare, "--net"] if probe.returncode == 0 else []


def test_the_docs_site_builds_strictly_without_the_network(tmp_path: Path) -> None:
    site = tmp_path / "site"
    # NO_MKDOCS_2_WARNING: the Material theme's notice about its successor, not a warning
    # about these pages.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [
            *without_network(),
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(site),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "WARNING" not in log, log[-4000:]
    for page in (ROOT / "docs").glob("*.md"):
        built = site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert built.exists(), f"{page.name} has no page in the site"
    # The changelog page is CHANGELOG.md itself, included.
    changelog = (site / "changelog" / "index.html").read_text(encoding="utf-8")
    assert "Unreleased" in changelog and "rlm-graph mcp" in changelog
