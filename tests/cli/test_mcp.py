"""``rlm-graph mcp`` as an agent meets it: the installed command started by the MCP SDK's
own stdio client, its tool listed and called, over a fake OpenAI server; and every way a
hostile prompt could ask it for a file outside its ``--read-path``."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

if importlib.util.find_spec("mcp") is None:  # the SDK loads in the tests (a second of import)
    pytest.skip("the MCP SDK (pip install 'rlm-graph[mcp]')", allow_module_level=True)

from rlm_graph.cli import main  # noqa: E402
from rlm_graph.testing import FakeOpenAIServer  # noqa: E402

pytestmark = pytest.mark.processes  # the installed command, as an MCP server

COMMAND = Path(sys.executable).with_name("rlm-graph")


def tree_path() -> str:
    """PYTHONPATH for the command: the folders this test imported rlm-graph and its
    plugins from first, so the command runs the tree under test even where another one
    is installed (the same folders again under an editable install)."""
    roots = []
    for package in ("rlm_graph", "rlm_graph_openai", "rlm_graph_subprocess"):
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin is not None, package
        root = str(Path(spec.origin).resolve().parents[1])
        if root not in roots:
            roots.append(root)
    return os.pathsep.join([*roots, *filter(None, [os.environ.get("PYTHONPATH")])])


KEY = "sk-mcp-test-key"
SECRET = "the-secret-outside-the-root"
# The root model's one turn: name each document and its text (context is a dict of path
# to text for paths=, the text itself for text=).
ROOT_CODE = (
    "```repl\n"
    "if isinstance(context, dict):\n"
    "    FINAL(' | '.join(f\"{k.rsplit('/', 1)[-1]}={v.strip()}\" for k, v in sorted(context.items())))\n"
    "else:\n"
    "    FINAL('text:' + context.strip())\n"
    "```"
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A read root holding docs/ (two files, a link out of the root, a binary file), and
    beside it, outside the root, a secret file and a sibling folder whose name starts
    like the root's."""
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.txt").write_text("alpha fact\n")
    (root / "docs" / "b.md").write_text("beta fact\n")
    (root / "docs" / "image.bin").write_bytes(b"\x89PNG\0\0\0")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text(SECRET)
    (tmp_path / "root-2").mkdir()
    (tmp_path / "root-2" / "secret.txt").write_text(SECRET)
    (root / "docs" / "link.txt").symlink_to(tmp_path / "outside" / "secret.txt")
    (root / "escape").symlink_to(tmp_path / "outside")
    return root


@contextmanager
def model_server(code: str = ROOT_CODE) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(lambda body: code, api_key=KEY) as server:
        yield server


@asynccontextmanager
async def session(
    server: FakeOpenAIServer, root: Path, log: Path, *extra: str
) -> AsyncIterator[Any]:
    """The installed command, started and spoken to by the SDK's stdio client."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    assert COMMAND.exists(), f"{COMMAND} is missing: run `make install`"
    params = StdioServerParameters(
        command=str(COMMAND),
        args=[
            "mcp",
            "--read-path",
            str(root),
            "--model",
            "gpt-test",
            "--base-url",
            server.base_url,
            "--api-key-env",
            "OPENAI_API_KEY",
            *extra,
        ],
        env={"OPENAI_API_KEY": KEY, "PYTHONPATH": tree_path()},
    )
    with log.open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                yield client


def text_of(result: Any) -> str:
    return "\n".join(getattr(part, "text", "") for part in result.content)


async def test_the_tool_is_listed_and_answers_over_the_files_named(
    tree: Path, tmp_path: Path
) -> None:
    reports = tmp_path / "reports"
    with model_server() as server:
        async with session(
            server, tree, tmp_path / "server.log", "--report-dir", str(reports)
        ) as client:
            listed = await client.list_tools()
            result = await client.call_tool(
                "rlm_answer",
                {"question": "Which facts?", "paths": ["docs", str(tree / "docs" / "a.txt")]},
            )
            text_result = await client.call_tool(
                "rlm_answer", {"question": "Shout it.", "text": "a small document"}
            )
            # One path as a string, as agents often give it: the pydantic report it got.
            one = await client.call_tool("rlm_answer", {"question": "Which?", "paths": "docs"})
        bodies = json.dumps(server.bodies)
    log = (tmp_path / "server.log").read_text()
    tool = {t.name: t for t in listed.tools}["rlm_answer"]
    assert {"question", "paths", "text"} <= set(tool.input_schema["properties"])
    assert tool.input_schema["required"] == ["question"]
    assert str(tree) in (tool.description or "")  # the agent is told what it may read

    assert not result.is_error, text_of(result) + log
    found = result.structured_content
    assert found is not None
    assert found["answer"] == "a.txt=alpha fact | b.md=beta fact"
    assert found["stop_reason"] is None and found["files_read"] == 2
    assert found["usage"]["model_usage_summaries"]["gpt-test"]["total_calls"] == 1
    assert "cost_usd" in found and found["execution_time"] > 0
    assert any("link.txt" in s and "out of the read roots" in s for s in found["skipped"])
    assert any("image.bin" in s and "binary" in s for s in found["skipped"])
    assert json.loads(text_of(result))["answer"] == found["answer"]  # the text form too

    report = Path(found["report"])
    assert report.parent == reports.resolve()
    assert stat.S_IMODE(report.stat().st_mode) == 0o600
    assert stat.S_IMODE(reports.stat().st_mode) == 0o700
    assert report.read_text().lstrip().lower().startswith("<!doctype html")

    assert not text_result.is_error, text_of(text_result)
    assert text_result.structured_content is not None
    assert text_result.structured_content["answer"] == "text:a small document"
    assert SECRET not in bodies and "refs/heads" not in bodies  # no link out, no .git
    assert KEY not in text_of(result) + text_of(text_result)
    assert not one.is_error, text_of(one)
    assert one.structured_content is not None
    assert one.structured_content["answer"] == found["answer"]


async def test_paths_outside_the_read_roots_are_refused_before_any_model_call(
    tree: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside" / "secret.txt"
    attempts = [
        ["/etc/shadow"],
        ["/etc/passwd"],
        [str(outside)],
        ["../outside/secret.txt"],
        [f"{tree}/docs/../../outside/secret.txt"],
        [str(tree / "docs" / "link.txt")],  # a link in the root to a file out of it
        ["escape/secret.txt"],  # through a linked folder
        ["escape"],
        [str(tmp_path / "root-2" / "secret.txt")],  # a sibling whose name starts the same
        ["docs/a.txt", "/etc/hostname"],  # one bad path fails the whole call
    ]
    with model_server() as server:
        async with session(
            server,
            tree,
            tmp_path / "server.log",
            "--report-dir",
            str(tmp_path / "r"),
            "--max-read-bytes",
            "4000",
        ) as client:
            results = [
                await client.call_tool("rlm_answer", {"question": "Read it.", "paths": paths})
                for paths in attempts
            ]
            neither = await client.call_tool("rlm_answer", {"question": "Read it."})
            both = await client.call_tool(
                "rlm_answer", {"question": "Read it.", "paths": ["docs"], "text": "x"}
            )
            missing = await client.call_tool(
                "rlm_answer", {"question": "Read it.", "paths": ["nope.txt"]}
            )
            # The question counts in --max-read-bytes too: it goes to the model as well.
            empty = await client.call_tool("rlm_answer", {"question": " \n", "text": "x"})
            huge = await client.call_tool("rlm_answer", {"question": "q" * 5000, "text": "x"})
            with_text = await client.call_tool(
                "rlm_answer", {"question": "q" * 3000, "text": "x" * 1500}
            )
        requests = len(server.requests)
    for paths, result in zip(attempts, results, strict=True):
        assert result.is_error, (paths, text_of(result))
        assert "refused" in text_of(result) and "outside the folders" in text_of(result), text_of(
            result
        )
        assert SECRET not in text_of(result)
    assert neither.is_error and "either paths" in text_of(neither)
    assert empty.is_error and "the question is empty" in text_of(empty)
    assert huge.is_error and "the question is more than 4,000 bytes" in text_of(huge)
    assert with_text.is_error and "the text and the question come to more" in text_of(with_text)
    assert both.is_error and "not both" in text_of(both)
    assert missing.is_error and "does not exist" in text_of(missing)
    assert requests == 0  # nothing was ever sent to a model
    assert not list((tmp_path / "r").iterdir())  # and no report was left behind


async def test_calls_past_max_calls_wait_their_turn_and_each_is_answered(
    tree: Path, tmp_path: Path
) -> None:
    """An agent firing many calls at once held as many reads, guests and model calls as it
    fired (memory without a bound); past --max-calls they wait."""
    # Calls of 1.5 s: two guests started together reach the model well within that.
    with FakeOpenAIServer(lambda body: ROOT_CODE, api_key=KEY, latency=1.5) as server:
        async with session(
            server, tree, tmp_path / "server.log", "--max-calls", "2", "--report-dir",
            str(tmp_path / "r"),
        ) as client:  # fmt: skip
            answers: list[Any] = []

            async def ask(n: int) -> None:
                text = {"question": "Shout it.", "text": f"document {n}"}
                answers.append(await client.call_tool("rlm_answer", text))

            async with trio.open_nursery() as nursery:
                for n in range(5):
                    nursery.start_soon(ask, n)
    assert sorted(a.structured_content["answer"] for a in answers) == [
        f"text:document {n}" for n in range(5)
    ]
    assert len(server.requests) == 5 and server.peak_in_flight == 2


# The model's code, told to read past its context: a file of the read root by its own
# path, and a world-readable file of the system.
READ_CODE = """```repl
import json
seen = {{}}
for path in {paths!r}:
    try:
        open(path).read()
        seen[path] = "read"
    except OSError as exc:
        seen[path] = type(exc).__name__
FINAL(json.dumps({{"seen": seen, "context": sorted(context.values())}}))
```"""


async def test_the_model_s_code_reads_its_context_and_not_the_read_roots(
    tree: Path, tmp_path: Path
) -> None:
    from rlm_graph_subprocess.landlock import abi_version

    if abi_version() < 1:
        pytest.skip("no Landlock in this kernel: the guest reads what its user can")
    paths = [str(tree / "docs" / "b.md"), "/etc/passwd"]
    with model_server(READ_CODE.format(paths=paths)) as server:
        async with session(server, tree, tmp_path / "server.log") as client:
            result = await client.call_tool(
                "rlm_answer", {"question": "Read more.", "paths": ["docs/a.txt"]}
            )
    log = (tmp_path / "server.log").read_text()
    assert not result.is_error, text_of(result) + log
    assert result.structured_content is not None
    found = json.loads(result.structured_content["answer"])
    assert found["context"] == ["alpha fact\n"]  # what the tool read, handed over as data
    assert found["seen"][paths[0]] in {"PermissionError", "FileNotFoundError"}  # a root's file
    assert found["seen"]["/etc/passwd"] == "PermissionError"  # (Landlock) world-readable


def test_environment_local_is_refused_unless_allowed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from rlm_graph.cli import build_parser
    from rlm_graph.cli.mcp import build_server

    flags = ["mcp", "--read-path", str(tmp_path), "--backend", "scripted", "--model", "m"]
    assert main([*flags, "--environment", "local"]) == 2
    err = capsys.readouterr().err
    assert "--environment local runs the model's code inside this server's process" in err
    assert "use --environment subprocess (the default), or add --allow-local" in err
    args = build_parser().parse_args(
        [*flags, "--environment", "local", "--allow-local", "--report-dir", str(tmp_path / "r")]
    )
    build_server(args)  # accepted, knowingly


def test_without_the_sdk_the_command_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)  # `import mcp` now fails
    monkeypatch.setitem(sys.modules, "mcp.server", None)
    monkeypatch.setitem(sys.modules, "mcp.server.mcpserver", None)
    code = main(["mcp", "--read-path", str(tmp_path), "--model", "m"])
    err = capsys.readouterr().err
    assert code == 2
    assert "pip install 'rlm-graph[mcp]'" in err and "Traceback" not in err


def test_a_bad_flag_is_a_usage_error_before_serving(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["mcp", "--read-path", str(tmp_path / "missing"), "--model", "m"])
    assert code == 2 and "does not exist" in capsys.readouterr().err
    code = main(
        [
            "mcp",
            "--read-path",
            str(tmp_path),
            "--backend",
            "scripted",
            "--model",
            "m",
            "--environment",
            "nowhere",
        ]
    )
    assert code == 2 and "nowhere" in capsys.readouterr().err
    code = main(["mcp", "--read-path", str(tmp_path), "--model", "m", "--max-calls", "0"])
    assert code == 2 and "--max-calls 0: give at least 1" in capsys.readouterr().err


def test_a_report_dir_made_here_is_private(tmp_path: Path) -> None:
    # Through the parser, as the command does, without serving.
    from rlm_graph.cli import build_parser
    from rlm_graph.cli.mcp import build_server

    reports = tmp_path / "new" / "reports"
    args = build_parser().parse_args(
        [
            "mcp",
            "--read-path",
            str(tmp_path),
            "--backend",
            "scripted",
            "--model",
            "m",
            "--report-dir",
            str(reports),
        ]
    )
    build_server(args)
    assert stat.S_IMODE(reports.stat().st_mode) == 0o700
    assert os.access(reports, os.W_OK)


def test_a_server_started_with_stdin_closed_says_so_in_one_line(tmp_path: Path) -> None:
    """Started with no pipe to talk over (``<&-``), the SDK failed with a traceback."""
    import subprocess

    done = subprocess.run(
        [str(COMMAND), "mcp", "--read-path", str(tmp_path), "--model", "m"],
        capture_output=True,
        preexec_fn=lambda: os.close(0),
        env={**os.environ, "PYTHONPATH": tree_path()},
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.decode().strip().splitlines() == [
        "rlm-graph mcp: stdin or stdout is closed: an MCP client starts rlm-graph mcp with a "
        "pipe on both (see docs/mcp.md for a client's configuration)"
    ]


async def test_a_report_folder_gone_is_made_again_and_never_fails_a_call(
    tree: Path, tmp_path: Path
) -> None:
    """Removed while the server ran (a cleaner of /tmp), it failed every call after."""
    import shutil

    reports = tmp_path / "reports"
    with model_server() as server:
        async with session(
            server, tree, tmp_path / "server.log", "--report-dir", str(reports)
        ) as client:
            shutil.rmtree(reports)
            again = await client.call_tool("rlm_answer", {"question": "Q?", "text": "a"})
            shutil.rmtree(reports)
            reports.write_text("a file where the folder was")  # cannot be made again
            without = await client.call_tool("rlm_answer", {"question": "Q?", "text": "b"})
    assert not again.is_error, text_of(again)
    assert Path(again.structured_content["report"]).parent == reports.resolve()
    assert again.structured_content["no_report"] is None
    assert not without.is_error, text_of(without)
    assert without.structured_content["answer"] == "text:b"
    assert without.structured_content["report"] is None
    assert (
        f"cannot write a report in {reports.resolve()}" in (without.structured_content["no_report"])
    )


def test_a_plugin_that_exits_or_quotes_a_key_fails_its_call_not_the_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A provider plugin's ``sys.exit()`` went through every guard of the engine and of
    the tool and stopped the server; a key quoted in a plugin's error went to the client
    as it was."""
    from mcp.server.mcpserver.exceptions import ToolError

    from rlm_graph.cli import build_parser
    from rlm_graph.cli.mcp import _Tools
    from rlm_graph.errors import ProviderError

    planted = "sk-planted-mcp-key-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", planted)
    flags = ["mcp", "--read-path", str(tmp_path), "--backend", "scripted", "--model", "m"]
    args = build_parser().parse_args([*flags, "--environment", "local", "--allow-local"])
    tools = _Tools(args, None)

    def exits(request: Any) -> str:
        raise SystemExit(3)

    def quotes(request: Any) -> str:
        raise ProviderError(f"key {planted} is not allowed", provider="careless")

    tools.kwargs["backend_kwargs"] = {**tools.kwargs["backend_kwargs"], "respond": exits}
    with pytest.raises(ToolError) as exited:
        trio.run(tools.answer, "Q?", None, "text")
    assert "provider 'scripted' answered with SystemExit" in str(exited.value)
    tools.kwargs["backend_kwargs"] = {**tools.kwargs["backend_kwargs"], "respond": quotes}
    with pytest.raises(ToolError) as quoted:
        trio.run(tools.answer, "Q?", None, "text")
    assert planted not in str(quoted.value) and "key [REDACTED] is not allowed" in str(quoted.value)


def test_a_report_that_cannot_be_written_is_said_in_no_report(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The report's file was made but writing it failed (a full disk): the answer said
    ``report: null`` and ``no_report: null``, as if none had been asked for."""
    import errno

    import rlm_graph.cli.report
    from rlm_graph.cli import build_parser
    from rlm_graph.cli.mcp import _Tools

    def full(*args: Any, **kwargs: Any) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rlm_graph.cli.report, "write_report", full)
    flags = ["mcp", "--read-path", str(tmp_path), "--backend", "scripted", "--model", "m"]
    args = build_parser().parse_args(
        [*flags, "--environment", "local", "--allow-local", "--report-dir", str(tmp_path / "r")]
    )
    tools = _Tools(args, None)
    code = "```repl\nFINAL('done')\n```"
    tools.kwargs["backend_kwargs"] = {**tools.kwargs["backend_kwargs"], "respond": lambda r: code}
    answer = trio.run(tools.answer, "Q?", None, "text")
    assert answer.answer == "done" and answer.report is None
    assert answer.no_report is not None and "No space left on device" in answer.no_report
    assert list((tmp_path / "r").iterdir()) == []  # the empty file is not left behind
