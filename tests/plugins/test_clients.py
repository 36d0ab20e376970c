"""One HTTP client per trio loop: sync runs from many threads at once share the
provider's limits but never each other's client, and each reuses its own connections."""

from __future__ import annotations

import inspect
import threading
from typing import Any

from rlm_graph import RLM, Engine, Workflow
from rlm_graph._http.provider import JSONProvider
from rlm_graph.testing import FakeOpenAIServer
from rlm_graph_anthropic import AnthropicProvider
from rlm_graph_openai import OpenAIProvider
from tests.support.http import openai_kwargs


def _chain(length: int) -> tuple[Workflow, str]:
    """A workflow of ``length`` model calls, each after the previous one."""
    wf = Workflow()
    ref = wf.llm("step 0")
    for i in range(1, length):
        ref = wf.llm(lambda _, i=i: f"step {i}", ref)
    return wf, ref.id


def test_threads_each_keep_their_own_client_and_connections() -> None:
    threads, runs, calls = 6, 3, 4
    with FakeOpenAIServer(latency=0.002) as server:
        engine = Engine("openai", openai_kwargs(server, max_concurrent=3))
        answers: list[str] = []
        failures: list[BaseException] = []

        def work() -> None:
            try:
                for _ in range(runs):
                    wf, last = _chain(calls)
                    answers.append(engine.run(wf)[last])
            except BaseException as exc:  # reported below
                failures.append(exc)

        pool = [threading.Thread(target=work) for _ in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join(60)
    assert not failures
    assert answers == [f"echo: step {calls - 1}"] * (threads * runs)
    assert len(server.requests) == threads * runs * calls
    # Each run (one trio loop) makes its calls one after the other on one connection;
    # a client shared across loops was closed under its neighbours and reopened.
    assert server.connections_opened <= threads * runs
    # The provider's limit holds across the threads' loops.
    assert server.peak_in_flight <= 3
    assert engine.provider._client is None  # type: ignore[attr-defined]


def test_default_provider_concurrency_lets_one_batch_run_full_width() -> None:
    batch_default = inspect.signature(RLM).parameters["batch_max_concurrent"].default
    # No max_concurrent: the adaptive limit, which starts wide enough for a batch.
    assert inspect.signature(JSONProvider).parameters["max_concurrent"].default is None
    for provider in (
        OpenAIProvider(backend="vllm", model_name="m"),
        AnthropicProvider(model_name="m", base_url="http://127.0.0.1:1"),
    ):
        assert provider.initial_concurrency is not None
        assert provider.initial_concurrency >= batch_default
        assert provider.max_concurrent >= provider.initial_concurrency


def test_a_batch_runs_batch_max_concurrent_wide_by_default() -> None:
    code = (
        "answers = llm_query_batched([f'p{i}' for i in range(32)])\n"
        "FINAL(str(len(answers)) + ' answers')"
    )

    # Each sub-call is held at the server until 16 are in flight together: with a
    # narrower default the barrier breaks and the slots fail.
    barrier = threading.Barrier(16, timeout=20)

    def respond(body: dict[str, Any]) -> str:
        if any(m.get("role") == "system" for m in body["messages"]):
            return f"```repl\n{code}\n```"
        barrier.wait()
        return "ok"

    with FakeOpenAIServer(respond) as server:
        result = RLM("openai", openai_kwargs(server)).completion("ctx", root_prompt="q")
    assert result.response == "32 answers"
    assert server.peak_in_flight == 16
