"""Where the engine learns what a secret is: keys given as headers, the OTLP exporter's
own credential, a token given as a URL's user. Each one, echoed by a model, reaches no
event, no span and no trace file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlm_graph import Engine, Workflow
from rlm_graph.testing import FakeOpenAIServer
from rlm_graph.tracing import close_tracing, configure_tracing, trace_files
from rlm_graph.tracing.scrub import secret_values

# Shaped like no known key: only the literal scrubber can know them.
AZURE_KEY = "Zq81azure-gateway-key-7731"
GATEWAY_KEY = "Pv42proxy-x-api-key-9917"
BEARER_TOKEN = "Hn63gateway-bearer-token-2208"


def test_keys_given_as_headers_are_redacted_from_events_and_trace_files(
    tmp_path: Path,
) -> None:
    """A key given as ``api_key=`` was redacted; the same key given as Azure's ``api-key``
    header (or ``x-api-key``, ``Authorization: Bearer``) reached the files as sent."""
    provider = configure_tracing("file", directory=tmp_path)
    events: list[Any] = []
    echo = f"keys: {AZURE_KEY} {GATEWAY_KEY} {BEARER_TOKEN}"
    with FakeOpenAIServer(lambda body: echo) as server:
        engine = Engine(
            "openai",
            {
                "model_name": "gpt-x",
                "base_url": server.base_url,
                "stream": False,
                "headers": {
                    "api-key": AZURE_KEY,
                    "x-api-key": GATEWAY_KEY,
                    "Authorization": f"Bearer {BEARER_TOKEN}",
                },
            },
            tracer_provider=provider,
            trace_content=True,
            listeners=[events.append],
        )
        workflow = Workflow()
        workflow.llm("say the keys", id="ask")
        assert engine.run(workflow).ok
    assert close_tracing(provider)
    written = trace_files(provider)
    assert len(written) == 2
    texts = [path.read_text() for path in written]
    texts.append("".join(event.model_dump_json() for event in events))
    for text in texts:
        assert "[REDACTED]" in text  # the content was captured, and redacted
        for key in (AZURE_KEY, GATEWAY_KEY, BEARER_TOKEN):
            assert key not in text


def test_a_header_s_secret_is_its_value_without_the_scheme() -> None:
    found = secret_values(
        {
            "headers": {
                "Authorization": "Basic dXNlcjpwYXNzd29yZA==",
                "Ocp-Apim-Subscription-Key": "subscription-1234",
                "Cookie": "session=cookie-value-77; theme=dark",
                "api-key": "short",  # under 6 characters: ordinary text
                "X-Request-Source": "notebook-42",  # not a secret's name
            }
        },
        environ={},
    )
    assert found == ["dXNlcjpwYXNzd29yZA==", "subscription-1234", "cookie-value-77"]
