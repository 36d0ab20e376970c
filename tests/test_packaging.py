"""The package as a user installs it: the sdist and the wheel built from this checkout
(`python -m build`, the build requirements of pyproject.toml in an isolated
environment), checked by ``twine check --strict``, and the wheel installed with its
dependencies into a new venv, away from the source tree, where ``rlm-graph demo`` and
``rlm-graph plugins`` run. Package data (``py.typed``), entry points (the command and
the plugins) and the license file are what an editable install never shows missing."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ("anthropic", "compaction", "local", "openai", "ray", "scripted", "subprocess")


def run(*command: str | Path, cwd: Path, timeout: float = 600) -> str:
    # No PYTHONPATH and a working folder outside the checkout: the venv must stand alone.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    done = subprocess.run(
        [str(c) for c in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, (
        f"{command} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, ROOT, cwd=out)
    return out


def test_the_sdist_and_the_wheel_pass_twine_check_and_hold_what_they_should(dist: Path) -> None:
    (wheel,) = dist.glob("rlm_graph-*.whl")
    (sdist,) = dist.glob("rlm_graph-*.tar.gz")
    run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist, cwd=dist)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(f"{info}/METADATA").decode()
        points = archive.read(f"{info}/entry_points.txt").decode()
    assert "License-Expression: MIT" in metadata and f"{info}/licenses/LICENSE" in names
    assert "rlm_graph/py.typed" in names
    assert all(f"rlm_graph_{name}/py.typed" in names for name in PLUGINS)
    assert "rlm-graph = rlm_graph.cli:main" in points
    assert all(f"{name} = rlm_graph_{name}" in points for name in PLUGINS)
    assert not any(n.startswith(("tests/", "bench/", "docs/")) for n in names)
    with tarfile.open(sdist) as archive:
        members = {
            Path(m).relative_to(Path(m).parts[0]).as_posix() for m in archive.getnames() if "/" in m
        }
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml"} <= members
    assert not any(m.startswith("tests/") for m in members)  # not a suite that cannot run
    assert "Classifier: Typing :: Typed" in metadata


def test_the_wheel_installs_in_a_clean_venv_where_demo_and_plugins_run(
    dist: Path, tmp_path: Path
) -> None:
    (wheel,) = dist.glob("rlm_graph-*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    # With its dependencies, from the package index as pip is set up here (and its cache).
    run(
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        wheel,
        cwd=tmp_path,
    )
    where = run(
        python,
        "-c",
        "import rlm_graph, rlm_graph_local; print(rlm_graph.__file__, rlm_graph_local.__file__)",
        cwd=tmp_path,
    )
    assert all(Path(p).is_relative_to(venv) for p in where.split()), where

    command = venv / "bin" / "rlm-graph"
    demo = run(command, "demo", "--out", tmp_path / "graph.json", cwd=tmp_path, timeout=120)
    assert "Answer:" in demo and (tmp_path / "graph.json").exists()
    plugins = run(command, "plugins", cwd=tmp_path, timeout=60)
    for name in ("openai", "anthropic", "scripted", "local", "subprocess", "summarize"):
        assert name in plugins
