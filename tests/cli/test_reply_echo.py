"""``rlm-graph run -v`` shows the root model's code as it is written: the display's echo of
a streamed reply, line by line, before the turn's own line."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest

from rlm_graph import RLM
from rlm_graph.cli.progress import ProgressDisplay, ReplyEcho
from rlm_graph.testing import FakeOpenAIServer
from tests.cli.test_command import COMMAND, _env, run_args
from tests.support.http import openai_kwargs
from tests.support.streams import FINISH, TurnScript, repl

CODE = "x = llm_query('first')\nprint(x)"


async def test_verbose_shows_the_root_models_code_before_the_turn_ends() -> None:
    out = io.StringIO()
    display = ProgressDisplay("plain", verbose=True, stream=out)
    script = TurnScript([repl(CODE, after="More words."), repl(FINISH)])
    with FakeOpenAIServer(script, stream_rate=1000) as server:
        async with RLM("openai", openai_kwargs(server), listeners=display.listeners()) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
    assert result.response == "done:sub:first"
    lines = out.getvalue().splitlines()
    echoed = [line[4:] for line in lines if line.startswith("  │ ")]
    assert echoed[:6] == ["Let me look.", "```repl", *CODE.split("\n"), "```", "More words."]
    first_turn = next(i for i, line in enumerate(lines) if line.lstrip().startswith("turn-1 "))
    assert lines.index("  │ " + CODE.split("\n")[0]) < first_turn


def test_a_retried_reply_is_shown_again_from_where_it_differs() -> None:
    said: list[str] = []
    echo = ReplyEcho(said.append)
    echo.add(0, "one\ntwo\nthr")
    echo.add(4, "TWO\nthree\n")  # a retried attempt: the reply goes on differently
    echo.add(14, "last")
    echo.end()
    assert said == [
        "  │ one",
        "  │ two",
        "  │ (the reply was retried and goes on differently:)",
        "  │ TWO",
        "  │ three",
        "  │ last",
    ]


@pytest.mark.processes
def test_verbose_never_echoes_the_key_the_model_repeats(tmp_path: Path) -> None:
    """``run -v`` printed the root model's reply as it came: a model that repeated the
    API key (given by --api-key-env) put it on stderr, which records redact."""
    key = "team-Q7xT2mVh9LpK4nRwZ3"
    reply = f"The key is {key}, I think.\n```repl\nanswer['content'] = 'ok'; answer['ready'] = True\n```"
    context = tmp_path / "ctx.txt"
    context.write_text("a document")
    with FakeOpenAIServer(lambda body: reply) as server:
        args = [*run_args(server, context, "-v", "--api-key-env", "TEAM_CREDS")]
        done = subprocess.run(
            [str(COMMAND), *args], capture_output=True, text=True, timeout=60, check=False,
            env={**_env(), "TEAM_CREDS": key},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "  │ The key is [REDACTED], I think." in done.stderr.splitlines()
    assert "Q7xT2mVh" not in done.stderr + done.stdout
