"""The example plugin of docs/writing-a-provider.md, installed by the test setup
(``pip install -e examples/rlm-graph-echo-provider``) and used by its backend name."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_graph import Engine, Workflow
from rlm_graph.hooks import PluginHost

EXAMPLE_TESTS = Path(__file__).parents[2] / "examples" / "rlm-graph-echo-provider" / "tests"


def test_the_echo_backend_is_registered_by_its_entry_point() -> None:
    origins = {r.name: r.origin for r in PluginHost().registrations()}
    assert "echo" in origins, "run: pip install -e examples/rlm-graph-echo-provider"
    assert "rlm-graph-echo-provider" in origins["echo"]


async def test_the_echo_backend_answers_over_http() -> None:
    from rlm_graph_echo.server import FakeEchoServer

    with FakeEchoServer() as server:
        async with Engine("echo", {"base_url": server.base_url}) as engine:
            wf = Workflow()
            ref = wf.llm("from the docs")
            result = await engine.arun(wf)
    assert result[ref] == "from the docs"


def test_the_example_s_own_tests_pass() -> None:
    code = pytest.main(["-q", "-p", "no:cacheprovider", str(EXAMPLE_TESTS)])
    assert code == 0
