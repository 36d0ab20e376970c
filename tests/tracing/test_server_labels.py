"""What a server names of its reply (the model that answered, why it stopped) is the
server's text like any other: scrubbed of secrets and bounded on spans, in trace files,
on the record and so in the graph JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlm_graph import Engine, Workflow
from rlm_graph.graph import to_json
from rlm_graph.testing import FakeOpenAIServer
from rlm_graph.tracing import close_tracing, configure_tracing, trace_files
from tests.support.tracing import Memory

# Given only in backend_kwargs and shaped like no known key: only the literal scrubber
# knows it.
GATEWAY_KEY = "Zq81-customer-gateway-key-7731"


def careless_gateway(body: dict[str, Any]) -> dict[str, Any]:
    """A reply naming, as the model and as the finish reason, the key it was sent."""
    return {
        "id": "x",
        "object": "chat.completion",
        "model": f"{body['model']}@{GATEWAY_KEY}" + "m" * 5000,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "an answer"},
                "finish_reason": f"stop {GATEWAY_KEY}" + "r" * 5000,
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def run_against(server: FakeOpenAIServer, tracer_provider: Any) -> str:
    engine = Engine(
        "openai",
        {
            "model_name": "gpt-x",
            "base_url": server.base_url,
            "api_key": GATEWAY_KEY,
            "stream": False,
        },
        tracer_provider=tracer_provider,
        trace_content=True,
    )
    wf = Workflow()
    wf.llm("q", id="ask")
    return to_json(engine.run(wf).graph)


def test_a_key_the_server_names_as_model_or_finish_reason_reaches_no_span(
    memory: Memory,
) -> None:
    with FakeOpenAIServer(careless_gateway) as server:
        run_against(server, memory.provider)
    attrs = dict(memory.by_node()["ask"].attributes or {})
    model = str(attrs["gen_ai.response.model"])
    (reason,) = attrs["gen_ai.response.finish_reasons"]  # type: ignore[misc]
    (message,) = json.loads(str(attrs["gen_ai.output.messages"]))
    for text in (model, reason, message["finish_reason"]):
        assert GATEWAY_KEY not in text and "[REDACTED]" in text
        assert len(text) <= 200
    assert model.startswith("gpt-x@[REDACTED]")


def test_a_key_the_server_names_reaches_no_trace_file_nor_the_graph_json(
    tmp_path: Path,
) -> None:
    provider = configure_tracing("file", directory=tmp_path)
    with FakeOpenAIServer(careless_gateway) as server:
        graph_json = run_against(server, provider)
    assert close_tracing(provider)
    written = trace_files(provider)
    assert len(written) == 2
    for path in written:
        assert GATEWAY_KEY not in path.read_text()
    assert GATEWAY_KEY not in graph_json
    (node,) = [n for n in json.loads(graph_json)["nodes"] if n["id"] == "ask"]
    assert node["response_model"].startswith("gpt-x@[REDACTED]")
    assert len(node["response_model"]) <= 200 and len(node["finish_reason"]) <= 200
