"""Shared limits over real HTTP, and the API key kept out of logs, errors and records."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest
import trio
import trio.testing

from rlm_graph import RLM, Engine, Workflow
from rlm_graph.errors import ConfigError, ProviderNotFound
from rlm_graph.graph import NodeStatus, to_json
from rlm_graph.runtime.slots import run_slots
from rlm_graph.testing import FakeOpenAIServer, Reply
from rlm_graph_openai import OpenAIProvider
from tests.support.http import KEY, openai_kwargs


async def test_64_calls_under_max_concurrent_8_never_exceed_8_at_the_server() -> None:
    with FakeOpenAIServer(latency=0.05) as server:
        async with Engine("openai", openai_kwargs(server, max_concurrent=8)) as engine:
            wf = Workflow()
            refs = [wf.llm(f"chunk {i}") for i in range(64)]
            result = await engine.arun(wf)
    assert [result[r] for r in refs] == [f"echo: chunk {i}" for i in range(64)]
    assert len(server.requests) == 64
    # Never above the limit; near it, so the calls really did overlap (a loaded 2-core
    # machine may keep one of the eight from overlapping the others' 50 ms).
    assert 6 <= server.peak_in_flight <= 8
    assert server.connections_opened <= 8


async def test_batch_slots_through_a_provider_also_hold_the_limit() -> None:
    with FakeOpenAIServer(latency=0.01) as server:
        async with Engine("openai", openai_kwargs(server, max_concurrent=8)) as engine:

            async def one(index: int, prompt: str) -> str:
                wf = Workflow()
                ref = wf.llm(prompt)
                return str((await engine.arun(wf))[ref])

            results = await run_slots([f"p{i}" for i in range(64)], one, limit=64)
    assert results == [f"echo: p{i}" for i in range(64)]
    assert server.peak_in_flight <= 8


async def test_requests_per_minute_holds(autojump_clock: trio.testing.MockClock) -> None:
    with FakeOpenAIServer() as server:
        kwargs = openai_kwargs(server, requests_per_minute=2, timeout=None)
        async with Engine("openai", kwargs) as engine:
            wf = Workflow()
            refs = [wf.llm(f"q{i}") for i in range(5)]
            start = trio.current_time()
            result = await engine.arun(wf)
    starts = sorted(result.graph[r.id].start - start for r in refs)  # type: ignore[operator]
    # A full bucket lets 2 through at once; then one every 30 s.
    assert starts == pytest.approx([0, 0, 30, 60, 90], abs=0.5)
    assert len(server.requests) == 5


async def test_key_never_in_logs_errors_or_records(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    replies = [
        Reply.error(429, f"slow down, {KEY}", retry_after="0.01"),  # a server echoing the key
        "fine",
        Reply.error(401, f"Incorrect API key provided: {KEY}"),
        Reply.dropped(),
        Reply.error(500, "boom"),
        # The lean transport re-sends a request whose reused connection dropped before
        # any answer, without spending an attempt: one more 500 for that case.
        Reply.error(500, "boom"),
    ]
    with FakeOpenAIServer(replies=replies) as server:
        kwargs = openai_kwargs(server, max_concurrent=1, max_attempts=2)
        async with Engine("openai", kwargs) as engine:
            wf = Workflow()
            first = wf.llm("one")
            second = wf.llm(lambda text: "two " + text, first)
            result = await engine.arun(wf)  # the 401 stops this workflow
            wf = Workflow()
            third = wf.llm("three")
            later = await engine.arun(wf)
            text_of_provider = repr(engine.provider) + repr(vars(engine.provider))
    assert result[first] == "fine"
    failed = [result.graph[second.id], later.graph[third.id]]
    assert [r.status for r in failed] == [NodeStatus.ERROR, NodeStatus.ERROR]
    assert failed[0].error_type == "ProviderAuthError"
    assert failed[1].error_type == "ProviderError"
    sources = {
        "log records": "\n".join(record.getMessage() for record in caplog.records),
        "log text": caplog.text,
        "graph": to_json(result.graph) + to_json(later.graph),
        "errors": "\n".join([*result.errors.values(), *later.errors.values()]),
        "values": "\n".join(str(v) for v in result.values.values()),
        "provider": text_of_provider,
    }
    assert "[REDACTED]" in sources["log text"] + sources["graph"]
    assert "retrying" in sources["log text"]
    assert [name for name, text in sources.items() if KEY in text] == []
    assert any(r.headers.get("authorization") == f"Bearer {KEY}" for r in server.requests)


def _six_a_minute(server: FakeOpenAIServer, max_timeout: float) -> RLM:
    """A sync RLM on ``server`` allowed six requests a minute."""
    return RLM(
        "vllm",
        {"model_name": "m", "base_url": server.base_url, "requests_per_minute": 6},
        max_timeout=max_timeout,
    )


def _batch_of(prompts: str) -> Callable[[object], str]:
    """The root's reply: one ``llm_query_batched`` of ``prompts``; every sub-call: "x"."""
    code = f"```repl\nFINAL(' '.join(llm_query_batched({list(prompts)!r})))\n```"
    return lambda body: code if "repl" in str(body) else "x"


def test_requests_per_minute_holds_across_sync_completions() -> None:
    """Each sync completion runs a trio loop of its own; the rate buckets are the
    engine's, not a loop's: a second completion does not get a fresh minute."""
    with FakeOpenAIServer(_batch_of("abcde")) as server:
        rlm = _six_a_minute(server, max_timeout=1.0)
        first = rlm.completion("ctx")  # six requests: the minute's whole allowance
        second = rlm.completion("ctx")  # the next request waits ten seconds
        sent = len(server.requests)
    assert first.stop_reason is None and first.response == "x x x x x"
    assert second.stop_reason == "max_timeout" and sent == 6


def test_requests_per_minute_holds_across_threads_at_once() -> None:
    """Two threads' sync completions at the same moment draw on one bucket."""
    with FakeOpenAIServer(_batch_of("abc")) as server:
        rlm = _six_a_minute(server, max_timeout=1.5)
        stops: list[str | None] = []
        threads = [
            threading.Thread(target=lambda: stops.append(rlm.completion("ctx").stop_reason))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        sent = len(server.requests)
    assert sent == 6  # 8 asked, the minute's 6 allowed
    assert len(stops) == 2 and "max_timeout" in stops  # whoever waited for the next minute


def test_a_base_urls_password_is_in_no_error_and_no_repr() -> None:
    """A 404 said ``POST http://alice:PASSWORD@host/... answered 404`` and named the
    base_url with its password; so did a provider's repr and a malformed base_url's error."""
    with FakeOpenAIServer(lambda body: "x", api_key="k") as server:
        url = server.base_url.replace("http://", "http://alice:URLPASSWORD@") + "/oops"
        rlm = RLM("openai", {"model_name": "m", "base_url": url, "api_key": "k", "stream": False})
        with pytest.raises(ProviderNotFound) as info:
            rlm.completion("ctx", root_prompt="q")
    assert "URLPASSWORD" not in str(info.value) and "alice:[REDACTED]@" in str(info.value)
    assert "URLPASSWORD" not in repr(OpenAIProvider(model_name="m", base_url=url, api_key="k"))
    with pytest.raises(ConfigError) as bad:
        OpenAIProvider(model_name="m", base_url="ftp://alice:URLPASSWORD@host/v1", api_key="k")
    assert "URLPASSWORD" not in str(bad.value) and "alice:[REDACTED]@" in str(bad.value)


@pytest.mark.parametrize("transport", ["lean", "httpx"])
def test_a_base_urls_user_and_password_are_sent_as_basic_auth_on_either_transport(
    transport: str,
) -> None:
    """The default transport dropped them: only httpx's sent the Basic auth the docs say."""
    with FakeOpenAIServer(lambda body: "```repl\nFINAL('ok')\n```") as server:
        url = server.base_url.replace("http://", "http://alice:S3cretPass@")
        kwargs = {"model_name": "m", "base_url": url, "http_transport": transport}
        assert RLM("openai", kwargs).completion("c", root_prompt="q").response == "ok"
        alone = {k.lower(): v for k, v in server.requests[-1].headers.items()}
        with_key = {**kwargs, "api_key": "sk-also-given-1234"}  # httpx's rule: the URL's wins
        assert RLM("openai", with_key).completion("c", root_prompt="q").response == "ok"
        both = {k.lower(): v for k, v in server.requests[-1].headers.items()}
    assert alone["authorization"] == both["authorization"] == "Basic YWxpY2U6UzNjcmV0UGFzcw=="


def test_a_secret_header_or_body_field_echoed_by_a_server_is_in_no_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The retry line quoted a 5xx body: a key given as a header (Azure's ``api-key``, an
    ``Authorization``) or a body field echoed in it was logged as it was."""
    secrets = ["Qz7pW3xLm9Rt2Vb8Nc4Kd6Hf", "Hd8Wq2Lp5Zx7Mn3Rv9Tb", "Ut4Yk8Pq2Ws6Nv3Jx7Lc"]
    secrets += ["Gw5Tr8Yu2Io4Pa6Sd", "Basic YWxpY2U6R3c1VHI4WXUySW80UGE2U2Q="]  # alice:its password
    with FakeOpenAIServer(lambda body: Reply.error(500, "echo: " + " ".join(secrets))) as server:
        kwargs = {
            "model_name": "m",
            "base_url": server.base_url.replace("http://", f"http://alice:{secrets[3]}@"),
            "headers": {"Authorization": f"Bearer {secrets[0]}", "api-key": secrets[1]},
            "extra_body": {"user_token": secrets[2]},
            "backoff_base": 0.001,
            "max_attempts": 2,
        }
        with caplog.at_level(logging.DEBUG, logger="rlm_graph"):
            with pytest.raises(Exception) as failed:
                RLM("openai", kwargs, max_iterations=1).completion("c", root_prompt="q")
    assert "echo:" in caplog.text  # the body was quoted, redacted
    assert not any(s in caplog.text or s in str(failed.value) for s in secrets)
