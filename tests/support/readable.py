"""A copy of the engine that every user can read, for tests that run it as another user.

A clone in a private folder (mode 0700: any ``mktemp -d``, root's home on most systems)
is closed to uid 65534, and so is the venv that ``make install`` puts inside it: an
engine started as that user could open neither a test's program nor ``rlm_graph``. Such
a test copies what the engine needs into a folder of its own under a temporary folder
every user can enter (`shared_temp`), opened to everyone: ``rlm_graph`` and the
first-party plugins as they are in this checkout (with their entry points), every
installed distribution they need (their requirements, followed, without extras), and the
test's own files.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from packaging.requirements import Requirement

__all__ = ["ReadableEngine", "interpreters_for_others", "probe"]

PROJECT = "rlm-graph"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _required(name: str) -> Iterator[str]:
    """The distributions ``name`` needs to run, without extras, ``name`` first."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = _canonical(todo.pop())
        if current in seen:
            continue
        seen.add(current)
        yield current
        for text in metadata.requires(current) or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)


def _reachable_by_all(folder: str) -> bool:
    """Whether every user can enter ``folder`` (it and each folder above it)."""
    path = Path(folder).resolve()
    return all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents))


def shared_temp() -> str:
    """A temporary folder every user can enter: the system's, else ``/var/tmp`` or
    ``/dev/shm`` (some machines make ``/tmp`` root's own, mode 0700)."""
    for folder in (tempfile.gettempdir(), "/var/tmp", "/dev/shm"):
        if os.path.isdir(folder) and os.access(folder, os.W_OK) and _reachable_by_all(folder):
            return folder
    return tempfile.gettempdir()  # none: the tests that need one skip, saying why


def _open_to_all(path: Path) -> None:
    for folder, _dirs, files in os.walk(path):
        os.chmod(folder, 0o755)
        for name in files:
            file = os.path.join(folder, name)
            os.chmod(file, 0o755 if os.access(file, os.X_OK) else 0o644)


class ReadableEngine:
    """A folder, readable by every user, holding an importable engine and some files.

    Attributes:
        root: the folder (under a temporary folder every user can enter).
        site: ``root/site``, to put first on ``PYTHONPATH``.
    """

    def __init__(self, files: Sequence[str] = ()) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rlm-graph-readable-", dir=shared_temp()))
        self.site = self.root / "site"
        self.site.mkdir()
        try:
            for file in files:
                shutil.copyfile(file, self.root / Path(file).name)
            self._copy_project()
            for name in list(_required(PROJECT))[1:]:
                self._copy_distribution(metadata.distribution(name))
            _open_to_all(self.root)
        except BaseException:
            self.remove()
            raise

    def path(self, file: str) -> str:
        """Where the copy of ``file`` (one of ``files``) is."""
        return str(self.root / Path(file).name)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _copy_project(self) -> None:
        # The project as it is in this checkout (an editable install's files are links
        # to it), and a dist-info with its entry points, which is how plugins are found.
        points = [
            p
            for p in metadata.entry_points(group="rlm_graph")
            if p.dist is not None and _canonical(p.dist.name) == PROJECT
        ]
        modules = {"rlm_graph", *(p.value.split(":")[0].split(".")[0] for p in points)}
        for module in sorted(modules):
            spec = importlib.util.find_spec(module)
            assert spec is not None and spec.submodule_search_locations, module
            shutil.copytree(
                next(iter(spec.submodule_search_locations)),
                self.site / module,
                ignore=shutil.ignore_patterns("__pycache__"),
            )
        dist = metadata.distribution(PROJECT)
        info = self.site / f"rlm_graph-{dist.version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {PROJECT}\nVersion: {dist.version}\n", encoding="utf-8"
        )
        (info / "entry_points.txt").write_text(
            dist.read_text("entry_points.txt") or "", encoding="utf-8"
        )

    def _copy_distribution(self, dist: metadata.Distribution) -> None:
        for entry in dist.files or ():
            if ".." in entry.parts or entry.parts[-1].endswith(".pyc"):
                continue  # scripts (../../bin) and caches
            source = Path(str(dist.locate_file(entry)))
            if source.is_file():
                target = self.site / entry
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)


def interpreters_for_others() -> list[str]:
    """Interpreters of this Python version outside any venv, this one's base first: a
    venv's ``bin/python`` inside a private folder is closed to other users."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = [
        os.path.realpath(sys.executable),
        getattr(sys, "_base_executable", None),
        shutil.which(version, path="/usr/bin:/usr/local/bin:/bin"),
    ]
    return list(dict.fromkeys(os.path.realpath(p) for p in found if p))


def probe(command: Sequence[str], engine: ReadableEngine, file: str) -> str | None:
    """Why ``command`` (an interpreter, run as another user) cannot import the engine
    from ``engine`` and read ``file`` there; ``None`` when it can."""
    check = f"import rlm_graph.cli, rlm_graph_subprocess; open({engine.path(file)!r}).close()"
    try:
        done = subprocess.run(
            [*command, "-c", check],
            env={**os.environ, "PYTHONPATH": str(engine.site)},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except OSError as exc:
        return f"{command[-1]}: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"{command[-1]}: {last}"
    return None
