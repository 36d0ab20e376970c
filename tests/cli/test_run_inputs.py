"""`rlm-graph run` given values a script or a slip of the hand gives it: an infinite price,
a codec that is not a text encoding, an empty read path, a key where a name goes, a
terminal that cannot print the answer, a rate under one a minute. Each is refused in one
line (exit 2) or works; none gives a traceback, a wrong figure or a key on the screen."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_command import COMMAND, _env, rlm_graph

pytestmark = pytest.mark.processes


def _scripted(code: str) -> list[str]:
    rules = json.dumps({"rules": [[".*", f"```repl\n{code}\n```"]]})
    return ["--model", "m", "--backend", "scripted", "--backend-kwargs", rules, "-q"]


@pytest.fixture
def context(tmp_path: Path) -> str:
    path = tmp_path / "ctx.txt"
    path.write_text("a document")
    return str(path)


@pytest.mark.parametrize("price", [["inf", "1"], ["1", "nan"], ["-1", "1"]])
def test_a_price_that_is_no_price_is_refused(context: str, price: list[str]) -> None:
    """``--price inf 1`` priced every call at NaN: the total printed ``$nan``, ``--json``
    printed a NaN (not JSON), and ``--max-budget`` never stopped the run."""
    done = rlm_graph(
        "run", "--context", context, "--query", "q", *_scripted("FINAL('x')"),
        "--price", *price, "--max-budget", "0.0001",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--price takes two finite numbers >= 0" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("codec", ["rot13", "base64", "zlib"])
def test_a_codec_that_is_no_text_encoding_is_refused_in_one_line(context: str, codec: str) -> None:
    done = rlm_graph(
        "run", "--context", context, "--query", "q", *_scripted("FINAL('x')"),
        "--encoding", codec, "--json",
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "not a text encoding" in json.loads(done.stdout)["error"]["message"]


def test_an_encoding_named_by_an_alias_reads_utf16_text(tmp_path: Path) -> None:
    """``--encoding utf16`` (Python's alias) on UTF-16 text was refused as binary."""
    path = tmp_path / "u16.txt"
    path.write_bytes("hi there".encode("utf-16-le"))
    done = rlm_graph(
        "run", "--context", str(path), "--query", "q", *_scripted("FINAL(context)"),
        "--encoding", "utf16",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "hi there"


def test_an_empty_read_path_is_refused_not_the_current_folder(tmp_path: Path) -> None:
    """``--read-path "$DIR"`` with ``DIR`` unset granted the guest the current folder."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "secret.txt").write_text("TOPSECRET")
    (folder / "ctx.txt").write_text("a document")
    code = "try:\n    FINAL(open('%s').read())\nexcept Exception as e:\n    FINAL(repr(e))" % (
        folder / "secret.txt"
    )
    done = subprocess.run(
        [str(COMMAND), "run", "--context", "ctx.txt", "--query", "q", *_scripted(code),
         "--read-path", ""],
        cwd=folder, capture_output=True, text=True, env=_env(), timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout
    assert "TOPSECRET" not in done.stdout
    assert "an empty path names no file or folder" in done.stderr


@pytest.mark.parametrize(
    "words",
    [
        ["--openai-api-key", "sk-proj-Q7xT2mVh9LpK4nRw"],
        ["--base-url", "http://127.0.0.1:9/v1", "--api-key-env", "sk-proj-Q7xT2mVh9LpK4nRw"],
        ["--api_key", "8f3a9c2eQ7xT2mVh9LpK4nRw"],
        ["--apikey", "8f3a9c2eQ7xT2mVh9LpK4nRw"],
        ["--key", "Q7xT2mVh9LpK4nRw"],
        ["--token=Q7xT2mVh9LpK4nRw"],
        ["--pasword", "hunter2-Q7xT2mVh9LpK4nRw", "and more"],
    ],
    ids=[
        "an unknown flag",
        "a key where its name goes",
        "--api_key",
        "--apikey",
        "--key",
        "--token=",
        "a misspelt --password",
    ],
)
def test_a_key_on_the_command_line_is_never_echoed(context: str, words: list[str]) -> None:
    """A misspelt key flag (``--api_key 8f3a...``) was echoed whole by argparse's
    "unrecognized arguments": only the flag's name is, never the words after it."""
    for extra in ([], ["--json"]):
        done = rlm_graph(
            "run", "--context", context, "--query", "q", "--model", "m", *words, *extra
        )
        assert done.returncode == 2
        assert "Q7xT2mVh9LpK4nRw" not in done.stdout + done.stderr
        if words[0] != "--base-url":
            assert "unrecognized arguments: " + words[0].split("=")[0] in (
                done.stdout + done.stderr
            )


def test_a_base_url_with_a_query_is_refused_without_its_key(context: str) -> None:
    """``--base-url 'http://h/v1?api-key=KEY'`` posted to ``...?api-key=KEY/chat/
    completions`` and printed the key in the connection error."""
    url = "http://127.0.0.1:9/v1?api-key=Q7xT2mVh9LpK4nRw"
    done = rlm_graph(
        "run", "--context", context, "--query", "q", "--model", "m", "--base-url", url,
        "--max-attempts", "1",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "has a query string" in line and "--api-key-env" in line
    assert "Q7xT2mVh9LpK4nRw" not in done.stdout + done.stderr


def test_a_terminal_that_cannot_print_a_character_still_gets_the_answer(context: str) -> None:
    """With ``PYTHONIOENCODING=latin-1`` an answer holding a snowman was lost to a
    ``UnicodeEncodeError`` traceback; the character prints as ``?``."""
    done = subprocess.run(
        [str(COMMAND), "run", "--context", context, "--query", "q",
         *_scripted("FINAL('snow \\u2603 done')")],
        capture_output=True, env={**_env(), "PYTHONIOENCODING": "latin-1"}, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode("latin-1").strip() == "snow ? done"


def test_a_rate_under_one_a_minute_lets_the_first_request_go(context: str) -> None:
    """``--requests-per-minute 0.1`` held back even the first request (540 s): a full
    bucket holds at least one request."""
    done = rlm_graph(
        "run", "--context", context, "--query", "q", *_scripted("FINAL('ans')"),
        "--requests-per-minute", "0.1", timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ans"


@pytest.mark.skipif(os.name != "posix", reason="ulimit")
def test_a_context_bigger_than_memory_is_refused_in_one_line(context: str) -> None:
    """An endless context (``/dev/zero``: binary) is refused at its first 64 KiB, not
    read to memory's end (a ``MemoryError`` traceback)."""
    done = rlm_graph("run", "--context", "/dev/zero", "--query", "q", *_scripted("FINAL(1)"))
    assert done.returncode == 2 and "looks like a binary file" in done.stderr


def test_an_answer_with_half_a_character_is_printed_not_lost(context: str) -> None:
    """A reply holding a lone surrogate (a JSON ``\\ud83d`` a server sent) crashed the
    printing of the answer with a ``UnicodeEncodeError`` (exit 1, the answer lost)."""
    rules = json.dumps({"rules": [[".*", "I could not find it \ud83d"]]})
    done = rlm_graph(
        "run", "--context", context, "--query", "q", "--backend", "scripted", "--model", "m",
        "--backend-kwargs", rules, "--max-iterations", "1", "-q",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr  # stopped by max_iterations: a partial answer
    assert done.stdout.strip() == "I could not find it \ufffd"


def test_json_gives_half_a_character_as_the_replacement_character(context: str) -> None:
    """``--json`` printed a lone surrogate as its escape (``"a\\ud800b"``), which a strict
    parser (serde_json, Go's) refuses; text mode printed U+FFFD. (The subprocess
    environment sends the answer as UTF-8, the local one hands it over as it is.)"""
    code = "FINAL('a' + chr(0xd800) + 'b')"
    done = rlm_graph(
        "run", "--context", context, "--query", "q", *_scripted(code), "--json",
        "--environment", "local",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\\ud800" not in done.stdout.lower()
    assert json.loads(done.stdout)["answer"] == "a\ufffdb"
