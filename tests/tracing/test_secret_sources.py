"""Where the engine learns what a secret is: keys given as headers, the OTLP exporter's
own credential, a token given as a URL's user. Each one, echoed by a model, reaches no
event, no span and no trace file."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from rlm_graph import RLM, Engine, Workflow
from rlm_graph.errors import ProviderError, without_url_passwords
from rlm_graph.events import NodeFinished, RunFinished
from rlm_graph.graph import to_json
from rlm_graph.testing import FakeOpenAIServer, Reply
from rlm_graph.tracing import close_tracing, configure_tracing, trace_files
from rlm_graph.tracing.scrub import secret_values
from tests.support.scripts import repl, root_and_sub

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


HONEYCOMB_KEY = "hcaik_01hqk7x3v9m2c8d4f6g1h5j0"
COLLECTOR_TOKEN = "Tr59collector-token/2208+x"


def test_the_exporter_s_credential_in_otel_headers_is_redacted_when_code_prints_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A ``*_API_KEY`` variable's value was redacted; the OTLP exporter's own key, in
    ``OTEL_EXPORTER_OTLP_HEADERS`` under a name like ``x-honeycomb-team``, was not."""
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_HEADERS", f"x-honeycomb-team={HONEYCOMB_KEY},x-honeycomb-dataset=rlm"
    )
    encoded = quote(f"Bearer {COLLECTOR_TOKEN}", safe="")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", f"Authorization={encoded}")
    code = (
        "import os\nfrom urllib.parse import unquote\n"
        "print(os.environ['OTEL_EXPORTER_OTLP_HEADERS'])\n"
        "print(unquote(os.environ['OTEL_EXPORTER_OTLP_TRACES_HEADERS']))\nFINAL('done')"
    )
    provider = configure_tracing("file", directory=tmp_path)
    events: list[Any] = []
    rlm = RLM(
        "scripted",
        {"respond": root_and_sub([repl(code)])},
        tracer_provider=provider,
        trace_content=True,
        listeners=[events.append],
    )
    result = rlm.completion("ctx")
    assert close_tracing(provider)
    texts = [path.read_text() for path in trace_files(provider)]
    texts += [to_json(result.graph), "".join(e.model_dump_json() for e in events)]
    for text in texts:
        assert "x-honeycomb-team=[REDACTED]" in text  # the output was captured, redacted
        assert HONEYCOMB_KEY not in text and COLLECTOR_TOKEN not in text
        assert encoded not in text


def test_a_token_given_as_a_url_s_user_is_redacted_from_errors_and_events() -> None:
    """``http://token@host`` is sent as Basic auth: the token is a credential, but only a
    ``user:password@`` was redacted, so the error of a failed call quoted it."""
    token = "glpat-abcdefghijklmnopqrst"
    events: list[Any] = []
    with FakeOpenAIServer(replies=[Reply.error(404, "no such model")]) as server:
        url = server.base_url.replace("://", f"://{token}@")
        rlm = RLM("openai", {"model_name": "m", "base_url": url}, listeners=[events.append])
        with pytest.raises(ProviderError) as raised:
            rlm.completion("ctx")
    assert token not in str(raised.value)
    assert "http://[REDACTED]@127.0.0.1" in str(raised.value)
    errors = [e.error for e in events if isinstance(e, NodeFinished | RunFinished)]
    assert len(errors) == 2 and all(e and "[REDACTED]@" in e for e in errors)
    assert token not in "".join(e.model_dump_json() for e in events)


def test_a_url_s_user_is_redacted_in_one_pass_over_a_long_text() -> None:
    """The model's or a server's text: each ``://`` is tried twice, each a linear scan
    (this runs in a fraction of a second; with backtracking it would not end)."""
    for text in ("x://" + "a:" * 50_000, "x://" * 25_000, "x://" + "a" * 99_990 + "@h"):
        without_url_passwords(text)
    assert without_url_passwords("x://" + "a" * 99_990 + "@h") == "x://[REDACTED]@h"
    assert without_url_passwords("ssh://u:p4ssword@h http://host:8080/v1") == (
        "ssh://u:[REDACTED]@h http://host:8080/v1"
    )


def test_a_password_holding_an_at_sign_is_redacted_whole() -> None:
    """A URL parser reads ``alice:Sup3r@Secr3tTail99@host`` as the password
    ``Sup3r@Secr3tTail99``: only ``Sup3r`` was redacted, the rest of it shown."""
    assert without_url_passwords("http://alice:Sup3r@Secr3tTail99@host/v1?x=a@b") == (
        "http://alice:[REDACTED]@host/v1?x=a@b"
    )
    assert without_url_passwords("http://u:p@host?email=a@b.org") == (
        "http://u:[REDACTED]@host?email=a@b.org"
    )
    for odd in ("Pa#ss99", "Pa?ss99"):  # unencoded too: redacted as before, whole
        assert without_url_passwords(f"https://alice:{odd}@host/v1") == (
            "https://alice:[REDACTED]@host/v1"
        )
    assert without_url_passwords('["http://u:p@a.com","bob@b.com"]') == (
        '["http://u:[REDACTED]@a.com","bob@b.com"]'
    )


def test_a_url_without_a_user_keeps_its_text() -> None:
    """A query holding an address, a list of URLs and addresses, a short user: the text
    after ``://`` up to an ``@`` was taken for a user and redacted with the host."""
    for text in (
        "Search: https://example.com?email=alice@example.org",
        '["http://a.example.com","bob@b.example.com"]',
        "see [docs](https://site.org)or mail team@site.org",
        "git clone ssh://git@github.com/org/repo.git",
    ):
        assert without_url_passwords(text) == text


def test_the_exporter_s_header_values_are_secrets_decoded_and_as_given() -> None:
    """The values of secret-looking headers and of a vendor's credential header; not a
    dataset's or a tenant's name (``production`` in every sentence was redacted)."""
    environ = {
        "OTEL_EXPORTER_OTLP_HEADERS": (
            "api-key=abc%2Fdef123, x-honeycomb-team = plainvalue9,tiny=ab,"
            "x-honeycomb-dataset=production,X-Scope-OrgID=research-team"
        ),
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Basic%20dXNlcjpwYXNz",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318",
    }
    assert set(secret_values(environ=environ)) == {
        "abc%2Fdef123",
        "abc/def123",
        "plainvalue9",
        "Basic%20dXNlcjpwYXNz",
        "dXNlcjpwYXNz",
    }
