"""A workflow function node's journal key covers its code, its closure and the globals
it reads: a changed function is a divergence the run reports, never a stale replay; and
the key is the same in every process for the same code."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rlm_graph import Engine, Workflow
from rlm_graph.journal.code import function_fingerprint, stable_value
from rlm_graph.journal.keys import canonical_json
from tests.support.scripts import scripted


def joined_by(sep: str) -> Callable[..., str]:
    return lambda *parts: sep.join(parts)


def summaries(merge: Callable[..., Any]) -> Workflow:
    wf = Workflow()
    maps = [wf.llm(f"part {i}", id=f"map-{i}") for i in range(4)]
    wf.function(merge, *maps, id="merge")
    return wf


def engine() -> Engine:
    return Engine("scripted", {"respond": lambda r: r.prompt.upper()})


async def test_a_changed_closure_value_is_a_divergence(tmp_path: Path) -> None:
    journal = tmp_path / "wf.sqlite"
    first = await engine().arun(summaries(joined_by(", ")), journal=journal)
    assert first["merge"] == "PART 0, PART 1, PART 2, PART 3"
    same = await engine().arun(summaries(joined_by(", ")), journal=journal)
    assert same.replay is not None and same.replay.replayed == 5 and same.replay.diverged == 0
    changed = await engine().arun(summaries(joined_by(" | ")), journal=journal)
    assert changed["merge"] == "PART 0 | PART 1 | PART 2 | PART 3"  # not the stale ", "
    assert changed.replay is not None
    assert changed.replay.diverged == 1 and changed.replay.diverged_at == "merge"
    assert not changed.graph["merge"].replayed


class Joiner:
    """Its ``join`` is a bound method whose result depends on the instance."""

    def __init__(self, sep: str) -> None:
        self.sep = sep

    def join(self, *parts: str) -> str:
        return self.sep.join(parts)

    def __call__(self, *parts: str) -> str:
        return self.join(*parts)


@dataclasses.dataclass(slots=True)
class SlottedJoiner:
    sep: str

    def join(self, *parts: str) -> str:
        return self.sep.join(parts)


@pytest.mark.parametrize(
    "make",
    [lambda sep: Joiner(sep).join, Joiner, lambda sep: SlottedJoiner(sep).join],
    ids=["bound method", "callable object", "slotted dataclass"],
)
async def test_a_changed_instance_is_a_divergence(
    tmp_path: Path, make: Callable[[str], Callable[..., str]]
) -> None:
    journal = tmp_path / "wf.sqlite"
    await engine().arun(summaries(make(", ")), journal=journal)
    same = await engine().arun(summaries(make(", ")), journal=journal)
    assert same.replay is not None and same.replay.replayed == 5 and same.replay.diverged == 0
    changed = await engine().arun(summaries(make(" | ")), journal=journal)
    assert changed["merge"] == "PART 0 | PART 1 | PART 2 | PART 3"  # not the stale ", "
    assert changed.replay is not None
    assert changed.replay.diverged == 1 and changed.replay.diverged_at == "merge"


def test_an_instance_s_state_is_read_within_bounds() -> None:
    assert function_fingerprint(", ".join) != function_fingerprint(" | ".join)
    assert function_fingerprint(", ".join) == function_fingerprint(", ".join)

    class Node:
        pass

    looped = Node()
    looped.me = looped  # type: ignore[attr-defined]  # a cycle ends at the depth cap
    assert "me" in str(stable_value(looped))
    # A C object has no state to read: its type stands for it (docs: use cache=False).
    assert stable_value(threading.Lock()) == ["object", "_thread.lock"]


def load(tmp_path: Path, name: str, source: str) -> ModuleType:
    """Module ``flows`` from a file of its own (as a user's edited script is)."""
    path = tmp_path / name / "flows.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location("flows", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "before, after",
    [
        (  # the body
            "def merge(*parts):\n    return '-'.join(parts)\n",
            "def merge(*parts):\n    return '+'.join(parts)\n",
        ),
        (  # a global it reads
            "SEP = '-'\ndef merge(*parts):\n    return SEP.join(parts)\n",
            "SEP = '+'\ndef merge(*parts):\n    return SEP.join(parts)\n",
        ),
        (  # a helper it calls
            "def sep():\n    return '-'\ndef merge(*parts):\n    return sep().join(parts)\n",
            "def sep():\n    return '+'\ndef merge(*parts):\n    return sep().join(parts)\n",
        ),
        (  # a method of a class it uses
            "class J:\n    def sep(self):\n        return '-'\n"
            "    def join(self, parts):\n        return self.sep().join(parts)\n"
            "def merge(*parts):\n    return J().join(parts)\n",
            "class J:\n    def sep(self):\n        return '+'\n"
            "    def join(self, parts):\n        return self.sep().join(parts)\n"
            "def merge(*parts):\n    return J().join(parts)\n",
        ),
        (  # a class attribute
            "class J:\n    SEP = '-'\ndef merge(*parts):\n    return J.SEP.join(parts)\n",
            "class J:\n    SEP = '+'\ndef merge(*parts):\n    return J.SEP.join(parts)\n",
        ),
        (  # the wrapper of a decorated function (inspect.getsource showed the inner one)
            "import functools\ndef deco(f):\n    @functools.wraps(f)\n"
            "    def wrapper(*parts):\n        return '-'.join(parts)\n    return wrapper\n"
            "@deco\ndef merge(*parts):\n    return None\n",
            "import functools\ndef deco(f):\n    @functools.wraps(f)\n"
            "    def wrapper(*parts):\n        return '+'.join(parts)\n    return wrapper\n"
            "@deco\ndef merge(*parts):\n    return None\n",
        ),
        (  # another lambda of the same line
            "OPS = {'a': lambda *p: '-'.join(p), 'b': lambda *p: '+'.join(p)}\nmerge = OPS['a']\n",
            "OPS = {'a': lambda *p: '-'.join(p), 'b': lambda *p: '+'.join(p)}\nmerge = OPS['b']\n",
        ),
        (  # a helper five calls down
            "def h4():\n    return '-'\ndef h3():\n    return h4()\ndef h2():\n    return h3()\n"
            "def h1():\n    return h2()\ndef merge(*parts):\n    return h1().join(parts)\n",
            "def h4():\n    return '+'\ndef h3():\n    return h4()\ndef h2():\n    return h3()\n"
            "def h1():\n    return h2()\ndef merge(*parts):\n    return h1().join(parts)\n",
        ),
    ],
    ids=["body", "global", "helper", "method", "class-attribute", "decorator", "lambda", "deep"],
)
async def test_a_changed_function_is_a_divergence(tmp_path: Path, before: str, after: str) -> None:
    journal = tmp_path / "wf.sqlite"
    old = load(tmp_path, "v1", before)
    first = await engine().arun(summaries(old.merge), journal=journal)
    assert first["merge"] == "PART 0-PART 1-PART 2-PART 3"
    new = load(tmp_path, "v2", after)
    e = engine()
    second = await e.arun(summaries(new.merge), journal=journal)
    assert second["merge"] == "PART 0+PART 1+PART 2+PART 3"
    assert second.replay is not None and second.replay.diverged_at == "merge"
    assert len(scripted(e).requests) == 0  # the model calls before it still replayed


def test_the_fingerprint_ignores_addresses_and_hash_order() -> None:
    class Thing:
        pass

    assert stable_value(Thing()) == stable_value(Thing())  # "<... object at 0x...>"
    assert stable_value({"b", "a"}) == stable_value({"a", "b"})
    assert stable_value({"x": 1.0}) != stable_value({"x": 1})
    tag = "a"
    assert function_fingerprint(lambda: tag) == function_fingerprint(lambda: tag)


SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from rlm_graph.journal.code import function_fingerprint
WORDS = {{"gamma", "alpha", "beta"}}
TABLE = {{"k": [1, 2.5, None], "s": frozenset({{"x", "y", "z"}})}}
LENGTHS = {{word: len(word) for word in WORDS}}  # built in the set's hash order
class Box:
    pass
BOX = Box()
BOX.words = WORDS  # an instance's state counts, sorted as any set
import dataclasses
@dataclasses.dataclass
class Cfg:
    stop: set
CFG = Cfg({{"the", "a", "an", "of", "to"}})  # its repr shows the set in hash order
import logging, pathlib, types
DATA = pathlib.Path("/data/items.jsonl")  # keeps its string's hash (random) in a slot
log = logging.getLogger("flows")
NS = types.SimpleNamespace(tags={{"x", "y", "z"}})
def outer(sep):
    def merge(*parts):
        log.debug("merging")
        text = str(TABLE) + str(LENGTHS) + repr(BOX) + repr(CFG) + str(DATA) + repr(NS)
        return sep.join(sorted(WORDS)) + text + sep.join(parts)
    return merge
print(function_fingerprint(outer(", ")))
"""


@pytest.mark.processes
def test_the_key_is_the_same_in_every_process(tmp_path: Path) -> None:
    script = tmp_path / "keys.py"
    script.write_text(SCRIPT.format(root=str(Path(__file__).parents[2])))
    keys = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
        )
        assert done.returncode == 0, done.stderr
        keys.add(done.stdout.strip())
    assert len(keys) == 1


class Memo:
    """A callable object that remembers what it saw: its state changes as nodes run."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, text: str) -> str:
        self.seen[text] = len(self.seen)
        return text.lower()


async def test_a_function_is_keyed_as_it_was_when_the_run_started(tmp_path: Path) -> None:
    """Keys read a callable's state when each node started: its memo, filled by the
    first node in a first run and empty in a rerun that replayed that node, gave the
    second node another key, and the rest of the run was paid again."""
    journal = tmp_path / "wf.sqlite"

    def flow(memo: Memo) -> Workflow:
        wf = Workflow()
        first = wf.function(memo, wf.llm("part a", id="a"), id="first")
        wf.function(memo, wf.llm(lambda text: f"again {text}", first, id="b"), id="second")
        return wf

    await engine().arun(flow(Memo()), journal=journal)
    e = engine()
    again = await e.arun(flow(Memo()), journal=journal)  # as a new process would
    assert again.replay is not None and again.replay.diverged == 0
    assert again.replay.replayed == 4 and scripted(e).requests == []


CONSTANTS = """
import sys, time
sys.path.insert(0, {root!r})
from rlm_graph.journal.code import function_fingerprint
class Level:
    def __init__(self, n):
        self.n = n
for i in range(8):  # class attributes that are its own instances: a constants pattern
    setattr(Level, f"L{{i}}", Level(i))
def rank(name):
    return getattr(Level, name).n
print(function_fingerprint(rank))
"""


@pytest.mark.processes
def test_a_class_holding_its_own_instances_is_read_once(tmp_path: Path) -> None:
    """Reading a class's attributes went into the class again at each of them: eight
    constants took longer than anyone waits (exponential), at the start of the run."""
    script = tmp_path / "constants.py"
    script.write_text(CONSTANTS.format(root=str(Path(__file__).parents[2])))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and len(done.stdout.strip()) == 32


class Unprintable:
    """An ORM row whose repr needs a session it no longer has."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __repr__(self) -> str:
        raise RuntimeError("repr not available")


def test_a_value_whose_repr_raises_is_keyed_by_its_type_and_state() -> None:
    assert stable_value(Unprintable(1)) == stable_value(Unprintable(1))
    assert stable_value(Unprintable(1)) != stable_value(Unprintable(2))
    assert "Unprintable object; its repr raised" in canonical_json([Unprintable(1)])
