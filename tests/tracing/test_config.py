"""Choosing where spans go: modes, the standard OTEL_* variables, clear errors."""

from __future__ import annotations

import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import NoOpTracerProvider

from rlm_graph.errors import ConfigError
from rlm_graph.tracing import (
    NodeTracer,
    configure_tracing,
    flush_tracing,
    trace_files,
    trace_mode_from_env,
    tracer_provider_from_env,
)
from rlm_graph.tracing.scrub import Scrubber, secret_values


@pytest.mark.parametrize(
    ("environ", "mode"),
    [
        ({}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, "none"),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, "none"),
    ],
)
def test_mode_from_the_standard_variables(environ: dict[str, str], mode: str | None) -> None:
    assert trace_mode_from_env(environ) == mode


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "supports 'otlp', 'console' and 'none'"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "name one exporter"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "port 4318"),
    ],
)
def test_settings_rlm_graph_cannot_honour_fail_clearly(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        tracer_provider_from_env(environ)


def test_no_variables_no_provider_and_none_is_a_disabled_tracer() -> None:
    assert tracer_provider_from_env({}) is None
    none = configure_tracing("none")
    assert isinstance(none, NoOpTracerProvider)
    assert not NodeTracer(none).enabled
    assert flush_tracing(none) and flush_tracing(None)
    assert trace_files(none) == []
    with pytest.raises(ConfigError, match="choose one of otlp, file, console, none"):
        configure_tracing("jaeger")  # type: ignore[arg-type]


def test_service_name_defaults_to_rlm_graph_unless_the_user_set_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    ours = configure_tracing("file", directory=str(tmp_path))
    assert isinstance(ours, SDKTracerProvider)
    assert ours.resource.attributes["service.name"] == "rlm-graph"
    assert ours.resource.attributes["service.version"]
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-app")
    theirs = configure_tracing("file", directory=str(tmp_path))
    assert theirs.resource.attributes["service.name"] == "my-app"  # type: ignore[attr-defined]
    for provider in (ours, theirs):
        provider.shutdown()  # type: ignore[attr-defined]


def test_secret_values_come_from_secret_names_only(monkeypatch: pytest.MonkeyPatch) -> None:
    found = secret_values(
        {"api_key": "abcdef123", "model_name": "gpt-4o-mini-long", "token": "x"},
        environ={"OPENAI_API_KEY": "sk-zzzzzzzz", "HOME": "/home/someone", "GH_TOKEN": "ghp_1"},
    )
    assert found == ["sk-zzzzzzzz", "abcdef123"]
    # api_key_env names the variable that holds the key: the name is no secret (the text
    # "TEAM_CREDS" in model code stays readable on spans), what the variable holds is,
    # whatever it is called
    monkeypatch.setenv("TEAM_CREDS", "team-credential-1234")
    assert secret_values({"api_key_env": "TEAM_CREDS"}, environ={}) == ["team-credential-1234"]
    monkeypatch.delenv("TEAM_CREDS")
    assert secret_values({"api_key_env": "TEAM_CREDS"}, environ={}) == []


@pytest.mark.parametrize(
    "text",
    [
        "sk-ant-api03-abcdefghijklmnop",
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig",
        "https://api.example.com/v1?api_key=abcd1234efgh",
        '{"password": "hunter2hunter2"}',
        "ghp_abcdefghijklmnopqrstuvwxyz0123",
        "hf_abcdefghijklmnopqrstu",
        "AKIAABCDEFGHIJKLMNOP",
    ],
)
def test_credential_shapes_are_redacted(text: str) -> None:
    scrubbed = Scrubber(environ={}).scrub(text)
    assert "[REDACTED]" in scrubbed
    for piece in ("abcdefghijklmnop", "abcd1234efgh", "hunter2hunter2", "ABCDEFGHIJKLMNOP"):
        assert piece not in scrubbed


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic [REDACTED]"),
        ("authorization: Token abcdefgh1234", "authorization: Token [REDACTED]"),
        ('{"password": "12345678"}', '{"password": "[REDACTED]"}'),
        ("client_secret=99999999", "client_secret=[REDACTED]"),
    ],
)
def test_a_pair_s_whole_value_is_redacted_its_scheme_and_name_kept(text: str, kept: str) -> None:
    """Not only the first word after ``Authorization:``; a password of digits too."""
    assert Scrubber(environ={}).scrub(text) == kept


def test_ordinary_text_is_left_alone() -> None:
    text = "the skeleton key: 42 tokens, sk-8 was fine; max_tokens=2000, token: 1.5"
    assert Scrubber(environ={}).scrub(text) == text


@pytest.mark.parametrize(
    ("filler", "secret", "kept"),
    [
        ("a-" * 100_000, " token=abcd1234", " token=[REDACTED]"),
        ("a." * 200_000, " x://u:hunter2pass@h", " x://u:[REDACTED]@h"),
    ],
)
def test_a_long_text_is_scrubbed_in_one_pass(filler: str, secret: str, kept: str) -> None:
    """Model text runs through the scrubber on the loop: a name or a scheme is looked for
    once per run of its characters, not again from each word boundary inside the run
    (``a-a-a-...`` of this length took half an hour, ``a.a.a...`` a minute and a half)."""
    assert Scrubber(environ={}).scrub(filler + secret) == filler + kept


def test_flush_waits_no_longer_than_its_timeout_when_the_collector_hangs() -> None:
    release = threading.Event()

    class Hanging(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            release.wait(10)
            return SpanExportResult.SUCCESS

    provider = configure_tracing("console", exporter=Hanging())
    provider.get_tracer("t").start_span("s").end()
    # False: it gave up before the hanging export returned (which would have said True).
    assert flush_tracing(provider, timeout_millis=100) is False
    release.set()
    assert flush_tracing(provider)
    provider.shutdown()  # type: ignore[attr-defined]
