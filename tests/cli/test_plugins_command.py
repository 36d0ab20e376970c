"""``rlm-graph plugins`` and engines with a broken third-party plugin installed: a real
distribution (a ``*.dist-info`` with its ``entry_points.txt``, on a ``sys.path`` entry
of a child process) whose module fails to import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

COMMAND = Path(sys.executable).with_name("rlm-graph")


@pytest.fixture
def broken_site(tmp_path: Path) -> Path:
    """A folder holding an installed distribution ``rlm-graph-broken``, entry point
    ``broken = rlm_graph_broken`` of group ``rlm_graph``, whose import fails."""
    dist = tmp_path / "rlm_graph_broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rlm-graph-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rlm_graph]\nbroken = rlm_graph_broken\n")
    (tmp_path / "rlm_graph_broken.py").write_text(
        "raise ImportError('rlm_graph_broken needs libfoo, which is not installed')\n"
    )
    return tmp_path


def _run(site: Path, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        list(args), capture_output=True, text=True, env=env, timeout=60, check=False, **kwargs
    )


def test_the_plugins_command_lists_a_broken_plugin_with_its_error(broken_site: Path) -> None:
    done = _run(broken_site, str(COMMAND), "plugins")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "failed to load" in done.stdout
    line = next(line for line in done.stdout.splitlines() if "rlm-graph-broken" in line)
    assert "broken" in line and "ImportError: rlm_graph_broken needs libfoo" in line
    assert "scripted" in done.stdout  # the plugins that load are listed as ever

    # One that calls sys.exit() as it is imported ended the command (exit 2, nothing said).
    (broken_site / "rlm_graph_broken.py").write_text("import sys\nsys.exit('no libfoo here')\n")
    done = _run(broken_site, str(COMMAND), "plugins")
    assert done.returncode == 0, done.stderr
    assert "SystemExit: no libfoo here" in done.stdout and "scripted" in done.stdout
    (broken_site / "rlm_graph_broken.py").write_text(
        "raise ImportError('rlm_graph_broken needs libfoo, which is not installed')\n"
    )

    done = _run(broken_site, str(COMMAND), "plugins", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    (broken,) = [row for row in rows if row["category"] == "broken"]
    assert broken["name"] == "broken" and "rlm-graph-broken" in broken["origin"]
    assert broken["error"].startswith("ImportError: rlm_graph_broken needs libfoo")
    assert ("providers", "scripted") in {(r["category"], r["name"]) for r in rows}


ENGINES = """
from rlm_graph import Engine, PluginError, Workflow
wf = Workflow()
node = wf.llm("hello")
print(Engine("scripted", {"respond": lambda r: "works: " + r.prompt}).run(wf)[node])
try:
    Engine("from-the-broken-one")
except PluginError as exc:
    print("refused:", exc)
"""


def test_engines_that_do_not_use_the_broken_plugin_work(broken_site: Path) -> None:
    done = _run(broken_site, sys.executable, "-c", ENGINES)
    assert done.returncode == 0, done.stderr
    works, refused = done.stdout.strip().splitlines()
    assert works == "works: hello"
    assert "unknown backend 'from-the-broken-one'" in refused
    assert "'broken' (rlm-graph-broken), which may provide it, failed to load" in refused


def test_a_reader_that_goes_away_ends_the_command_quietly(broken_site: Path) -> None:
    process = subprocess.Popen(
        [str(COMMAND), "plugins", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(broken_site)},
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # `| head` that has read enough: no reader left
    with process.stderr:
        err = process.stderr.read().decode()
    assert process.wait(timeout=60) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err


def _installed(site: Path, dist: str, module: str, source: str, value: str = "") -> Path:
    """An installed distribution ``dist`` whose entry point ``module`` is ``source`` (or
    ``value`` in it, e.g. ``module:Class``)."""
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[rlm_graph]\n{module} = {value or module}\n")
    (site / f"{module}.py").write_text(source)
    return site


FAILING_HOOK = """
import os
from rlm_graph import hookimpl

@hookimpl
def rlm_register_providers():
    return {"needs-env": os.environ["MY_PLUGIN_REQUIRED_VAR"]}
"""

MISSPELLED_HOOK = """
from rlm_graph import hookimpl

@hookimpl
def rlm_register_provider():
    return {}
"""

CLAIMS_OPENAI = """
from rlm_graph import hookimpl

class Hijack:
    pass

@hookimpl
def rlm_register_providers():
    return {"openai": Hijack, "mine": Hijack}
"""


def test_an_installed_plugin_whose_hook_fails_is_skipped_and_listed(tmp_path: Path) -> None:
    _installed(tmp_path, "rlm-graph-needs-env", "needs_env", FAILING_HOOK)
    _installed(tmp_path, "rlm-graph-typo", "typo_hook", MISSPELLED_HOOK)
    done = _run(tmp_path, str(COMMAND), "plugins", "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    broken = {
        row["name"]: row["error"] for row in json.loads(done.stdout) if row["category"] == "broken"
    }
    assert broken["needs_env"] == "rlm_register_providers raised KeyError: 'MY_PLUGIN_REQUIRED_VAR'"
    assert broken["typo_hook"].startswith(
        "unknown hook 'rlm_register_provider'; the rlm-graph hooks"
    )
    done = _run(tmp_path, sys.executable, "-c", ENGINES)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "works: hello"


CLASH = """
import json
import logging
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from rlm_graph.hooks import PluginHost
host = PluginHost()
PluginHost()  # a second engine's plugins: the same clash, said once per process
print(json.dumps({r.name: r.origin for r in host.registrations() if r.name in ("openai", "mine")}))
"""


def test_an_installed_plugin_cannot_take_a_built_in_name_and_the_clash_is_said(
    tmp_path: Path,
) -> None:
    # Named to sort after rlm-graph's own entry points and before them: the same outcome.
    for dist, module in (("zz-clash", "zz_clash"), ("aa-clash", "aa_clash")):
        site = tmp_path / dist
        site.mkdir()
        _installed(site, dist, module, CLAIMS_OPENAI)
        done = _run(site, sys.executable, "-c", CLASH)
        assert done.returncode == 0, done.stderr
        origins = json.loads(done.stdout)
        assert origins["openai"] == "entry point 'openai' of rlm-graph"
        assert origins["mine"] == f"entry point '{module}' of {dist}"
        assert done.stderr.count("backend 'openai' is registered by") == 1, done.stderr
        assert (
            f"of {dist}" in done.stderr
            and "entry point 'openai' of rlm-graph's is used" in done.stderr
        )


WRONG_ARGUMENTS = """
from rlm_graph import hookimpl

@hookimpl
def rlm_node_finished(node):  # the hook's arguments are (record, graph)
    pass
"""

A_CLASS = """
from rlm_graph import hookimpl

class MyPlugin:
    @hookimpl
    def rlm_register_models(self):
        return {}
"""

ASYNC_OBSERVER = """
from rlm_graph import hookimpl

@hookimpl
async def rlm_node_finished(record):
    pass
"""

FORGOT_RETURN = """
from rlm_graph import hookimpl

@hookimpl
def rlm_register_providers():
    {"mine": object}
"""


def test_installed_plugins_that_cannot_work_are_skipped_and_every_engine_still_runs(
    tmp_path: Path,
) -> None:
    """Hooks whose arguments are not the hook's, an entry point naming a class and an
    async hook (never awaited, so never run) each stopped every engine of the install, or
    was dropped without a word; a register hook that forgot its return is said."""
    _installed(tmp_path, "rlm-graph-wrong-args", "wrong_args", WRONG_ARGUMENTS)
    _installed(tmp_path, "rlm-graph-a-class", "a_class", A_CLASS, value="a_class:MyPlugin")
    _installed(tmp_path, "rlm-graph-async", "async_observer", ASYNC_OBSERVER)
    _installed(tmp_path, "rlm-graph-no-return", "no_return", FORGOT_RETURN)
    done = _run(tmp_path, sys.executable, "-c", ENGINES)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "works: hello"
    for name in ("wrong_args", "a_class", "async_observer"):
        assert f"the installed rlm-graph plugin {name!r}" in done.stderr, done.stderr
    assert "rlm_register_providers returned None, so it registers nothing" in done.stderr
    done = _run(tmp_path, str(COMMAND), "plugins", "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    broken = {
        row["name"]: row["error"] for row in json.loads(done.stdout) if row["category"] == "broken"
    }
    assert "declared in the hookimpl but can not be found in the hookspec" in broken["wrong_args"]
    assert "cannot register the class MyPlugin" in broken["a_class"]
    assert "hook rlm_node_finished is async" in broken["async_observer"]
    assert "no_return" not in broken  # it registers nothing, and is said to


FAST = """
from rlm_graph import hookimpl
from rlm_graph.contracts import ChatResponse

class Provider:
    name, model, max_concurrent = "NAME", "m", 2

    def __init__(self, **_):
        pass

    async def complete(self, request):
        return ChatResponse(content="answered by NAME")

    async def aclose(self):
        pass

@hookimpl
def rlm_register_providers():
    return {"fast": Provider}
"""

CHOOSE = """
import logging
logging.basicConfig(level=logging.WARNING, format="%(message)s")
import alpha_fast, beta_fast
from rlm_graph import Engine, Workflow
for chosen in ([], [alpha_fast], [beta_fast]):
    wf = Workflow()
    ref = wf.llm("q")
    print(Engine("fast", plugins=chosen).run(wf)[ref])
"""


def test_an_installed_plugin_passed_in_code_wins_a_clash_as_the_warning_says(
    tmp_path: Path,
) -> None:
    """The clash warning says to register yours in code to choose; passing the installed
    module in code changed nothing (the later entry point kept winning)."""
    for name in ("alpha", "beta"):
        _installed(tmp_path, f"{name}-fast", f"{name}_fast", FAST.replace("NAME", name))
    done = _run(tmp_path, sys.executable, "-c", CHOOSE)
    assert done.returncode == 0, done.stderr
    default, alpha, beta = done.stdout.splitlines()
    assert "register yours in code, plugins=[...], to choose" in done.stderr
    assert (alpha, beta) == ("answered by alpha", "answered by beta")


@pytest.mark.parametrize("target", ["rlm_graph_hookless:rlm_register_providers", "json"])
def test_an_entry_point_naming_no_hooks_is_listed_as_broken(tmp_path: Path, target: str) -> None:
    """An entry point naming the hook function itself, or a module without hooks, was
    dropped without a word: not warned of, not in `rlm-graph plugins`, not named when
    the backend it should provide was unknown."""
    dist = tmp_path / "rlm_graph_hookless-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: rlm-graph-hookless\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(f"[rlm_graph]\nhookless = {target}\n")
    (tmp_path / "rlm_graph_hookless.py").write_text(
        "from rlm_graph import hookimpl\n\n@hookimpl\ndef rlm_register_providers():\n"
        "    return {}\n"
    )
    done = _run(tmp_path, str(COMMAND), "plugins", "--json")
    assert done.returncode == 0, done.stderr
    (broken,) = [row for row in json.loads(done.stdout) if row["category"] == "broken"]
    assert broken["name"] == "hookless"
    assert f"its entry point ({target}) names an object with no @hookimpl hooks" in broken["error"]
