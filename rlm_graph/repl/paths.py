"""Relative paths in the REPL resolve in the session's scratch folder, without ``chdir``.

The ``local`` environment runs blocks in threads of the engine's process, whose working
directory is the engine's: changing it would move every other completion too. So the
REPL's ``__import__`` hands model code *views* of the modules it commonly uses for files,
in which a relative path means "in the scratch folder", as it does for the REPL's
``open``:

    open, os.* (stat, listdir, scandir, walk, mkdir, makedirs, remove, rename, ...),
    os.getcwd (the scratch folder), os.path.* (exists, isfile, getsize, abspath, ...),
    pathlib.Path (a relative Path is anchored in the scratch folder when made),
    shutil.* (copy, move, rmtree, ...), glob.glob / glob.iglob.

``os.chdir`` is refused with a message saying why. Other libraries (``io.open``, numpy,
pandas) open relative paths from the process's working directory: give them absolute
paths (``os.path.join(SCRATCH_DIR, name)``, or ``os.path.abspath(name)`` from the view).

Invariants:
    - A view is a module object whose listed functions are wrapped and whose other
      attributes are the real module's; ``view.__wrapped__`` is the real module.
    - Only relative ``str``/``bytes``/path-like arguments change; absolute paths, file
      descriptors and calls with ``dir_fd`` pass through untouched.
"""

from __future__ import annotations

import builtins
import glob
import os
import pathlib
import shutil
import types
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["scratch_import"]

# name -> indexes of the positional arguments that are paths (and keyword names).
_OS = {
    **dict.fromkeys(
        [
            "stat",
            "lstat",
            "mkdir",
            "makedirs",
            "remove",
            "unlink",
            "rmdir",
            "removedirs",
            "chmod",
            "chown",
            "access",
            "open",
            "walk",
            "fwalk",
            "utime",
            "truncate",
            "readlink",
            "statvfs",
            "mkfifo",
            "listxattr",
            "getxattr",
        ],
        (0,),
    ),
    "rename": (0, 1),
    "replace": (0, 1),
    "renames": (0, 1),
    "link": (0, 1),
    "symlink": (1,),  # the first argument is the link's text, not a path to resolve
}
_OS_DEFAULT_HERE = ("listdir", "scandir")  # no argument means "."
_OS_PATH = {
    **dict.fromkeys(
        [
            "exists",
            "lexists",
            "isfile",
            "isdir",
            "islink",
            "ismount",
            "getsize",
            "getmtime",
            "getatime",
            "getctime",
        ],
        (0,),
    ),
    "samefile": (0, 1),
}
_SHUTIL = {
    **dict.fromkeys(
        ["copy", "copy2", "copyfile", "copytree", "move", "copymode", "copystat"], (0, 1)
    ),
    **dict.fromkeys(["rmtree", "disk_usage"], (0,)),
    "unpack_archive": (0, 1),
}
_KEYWORDS = ("path", "src", "dst", "name", "top", "file", "filename", "extract_dir")


class _View(types.ModuleType):
    """A module that is the real one but for the functions it overrides."""

    __wrapped__: types.ModuleType

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    def __dir__(self) -> Iterable[str]:
        return sorted(set(dir(self.__wrapped__)) | set(self.__dict__))


def _view(real: types.ModuleType, overrides: dict[str, Any]) -> _View:
    view = _View(real.__name__, real.__doc__)
    view.__wrapped__ = real
    view.__dict__.update(overrides)
    return view


class _Resolver:
    def __init__(self, scratch: str) -> None:
        self.scratch = scratch
        self.scratch_bytes = os.fsencode(scratch)

    def path(self, value: Any) -> Any:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, str) and not os.path.isabs(value):
            return os.path.join(self.scratch, value)
        if isinstance(value, bytes) and not os.path.isabs(value):
            return os.path.join(self.scratch_bytes, value)
        return value

    def wrap(self, function: Callable[..., Any], where: tuple[int, ...], here: bool = False) -> Any:
        resolve = self.path
        scratch = self.scratch

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if "dir_fd" in kwargs or "src_dir_fd" in kwargs:
                return function(*args, **kwargs)
            if here and not args and "path" not in kwargs:
                args = (scratch,)
            args = tuple(resolve(a) if i in where else a for i, a in enumerate(args))
            for key in _KEYWORDS:
                if key in kwargs:
                    kwargs[key] = resolve(kwargs[key])
            return function(*args, **kwargs)

        wrapped.__name__ = wrapped.__qualname__ = getattr(function, "__name__", "wrapped")
        wrapped.__doc__ = function.__doc__
        wrapped.__wrapped__ = function  # type: ignore[attr-defined]
        return wrapped

    def table(self, real: types.ModuleType, spec: dict[str, tuple[int, ...]]) -> dict[str, Any]:
        return {
            name: self.wrap(getattr(real, name), where)
            for name, where in spec.items()
            if hasattr(real, name)
        }


def _chdir(path: Any) -> None:
    raise PermissionError(
        "os.chdir is not available in the REPL: the working directory belongs to the whole "
        "engine. Relative paths already resolve in SCRATCH_DIR; use paths under it"
    )


def _path_view(r: _Resolver) -> _View:
    scratch = r.scratch
    table = r.table(os.path, _OS_PATH)
    table["abspath"] = lambda path: os.path.normpath(r.path(path))
    table["realpath"] = lambda path, **kw: os.path.realpath(r.path(path), **kw)
    table["relpath"] = lambda path, start=None: os.path.relpath(
        r.path(path), r.path(start) if start is not None else scratch
    )
    return _view(os.path, table)


def _os_view(r: _Resolver, path_view: _View) -> _View:
    table = r.table(os, _OS)
    for name in _OS_DEFAULT_HERE:
        table[name] = r.wrap(getattr(os, name), (0,), here=True)
    table["getcwd"] = lambda: r.scratch
    table["getcwdb"] = lambda: r.scratch_bytes
    table["chdir"] = _chdir
    table["path"] = path_view
    return _view(os, table)


def _pathlib_view(r: _Resolver) -> _View:
    scratch = r.scratch

    class PosixPath(pathlib.PosixPath):
        """A ``pathlib.Path`` whose relative paths are anchored in the scratch folder."""

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            made = pathlib.PosixPath.__new__(cls, *args)
            return made if made.is_absolute() else pathlib.PosixPath.__new__(cls, scratch, *args)

        @classmethod
        def cwd(cls) -> Any:
            return cls(scratch)

    return _view(pathlib, {"Path": PosixPath, "PosixPath": PosixPath})


def _glob_view(r: _Resolver) -> _View:
    def here(function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(pathname: Any, *args: Any, root_dir: Any = None, **kwargs: Any) -> Any:
            if root_dir is None and not os.path.isabs(os.fspath(pathname)):
                root_dir = r.scratch
            return function(
                pathname, *args, root_dir=r.path(root_dir) if root_dir else None, **kwargs
            )

        wrapped.__name__ = function.__name__
        wrapped.__doc__ = function.__doc__
        return wrapped

    return _view(glob, {"glob": here(glob.glob), "iglob": here(glob.iglob)})


def scratch_import(scratch: str) -> Callable[..., Any]:
    """An ``__import__`` for the REPL that hands out the scratch-folder views.

    A view is made the first time the session's code imports its module: most blocks
    import none of them, and a session is made per completion.

    Args:
        scratch: the session's scratch folder (absolute).
    """
    r = _Resolver(os.path.abspath(scratch))
    views: dict[str, _View] = {}

    def path_view() -> _View:
        if "os.path" not in views:  # one view under both names, and as ``os.path``
            views["os.path"] = views["posixpath"] = _path_view(r)
        return views["os.path"]

    def view_of(name: str) -> _View | None:
        if name not in views:
            if name in ("os.path", "posixpath"):
                return path_view()
            if name == "os":
                views[name] = _os_view(r, path_view())
            elif name in _MAKERS:
                views[name] = _MAKERS[name](r)
            else:
                return None
        return views[name]

    real_import = builtins.__import__

    def __import__(  # noqa: A001 - the REPL's own
        name: str,
        globals: Any = None,  # noqa: A002
        locals: Any = None,  # noqa: A002
        fromlist: Any = (),
        level: int = 0,
    ) -> Any:
        module = real_import(name, globals, locals, fromlist, level)
        if level != 0 or getattr(module, "__name__", None) not in _VIEWED:
            return module
        view = view_of(name if fromlist else name.partition(".")[0])
        return view if view is not None and module is view.__wrapped__ else module

    return __import__


_MAKERS: dict[str, Callable[[_Resolver], _View]] = {
    "pathlib": _pathlib_view,
    "shutil": lambda r: _view(shutil, r.table(shutil, _SHUTIL)),
    "glob": _glob_view,
}
# The real modules' names (``os.path`` is ``posixpath``): any other import passes as is.
_VIEWED = frozenset({"os", "posixpath", "pathlib", "shutil", "glob"})
