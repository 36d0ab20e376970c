"""Images in sub-calls: ``llm_query([text, image])`` sends each provider's image parts
(checked in the body the fake server received), usage and cost are counted, and no
record, preview or span carries the image's bytes."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rlm_graph import RLM, NodeKind
from rlm_graph.contracts import Image
from rlm_graph.graph import to_json
from rlm_graph.testing import FakeAnthropicServer, FakeOpenAIServer
from rlm_graph.testing.apis import IMAGE_TOKENS
from tests.support.http import KEY, anthropic_kwargs, openai_kwargs


def png(width: int = 64, height: int = 64) -> bytes:
    """A real PNG of noise-free grey pixels, a few KB once padded with a text chunk."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    padding = chunk(b"tEXt", b"Comment\x00" + bytes(range(32, 127)) * 40)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + padding
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PICTURE = png()
B64 = base64.b64encode(PICTURE).decode()
ROOT = '```repl\nFINAL(llm_query(["What is in this picture?", context[1]]))\n```'


def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _no_bytes_anywhere(result: Any, exporter: InMemorySpanExporter) -> None:
    assert B64[:40] not in to_json(result.graph)
    (call,) = result.graph.records(NodeKind.LLM_CALL)
    assert (
        call.input_preview
        == f"What is in this picture?\n\n<image {round(len(PICTURE) / 1024)} KB png>"
    )
    for span in exporter.get_finished_spans():
        text = json.dumps({k: str(v) for k, v in (span.attributes or {}).items()})
        assert B64[:40] not in text


async def test_openai_gets_an_image_url_data_uri_part_and_counts_its_tokens() -> None:
    def respond(body: dict[str, Any]) -> str:
        system = any(m.get("role") == "system" for m in body["messages"])
        return ROOT if system else "a grey square"

    provider, exporter = spans()
    models = {"gpt-test": {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 1.0}}
    with FakeOpenAIServer(respond, api_key=KEY) as server:
        async with RLM(
            "openai",
            openai_kwargs(server),
            models=models,
            tracer_provider=provider,
            trace_content=True,
        ) as rlm:
            result = await rlm.acompletion(["a caption", Image.from_bytes(PICTURE)])
    assert result.response == "a grey square"
    sub = server.bodies[1]
    assert sub["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}"}},
            ],
        }
    ]
    (call,) = result.graph.records(NodeKind.LLM_CALL)
    assert call.usage is not None
    assert call.usage.input_tokens == server.responses[1][1]["usage"]["prompt_tokens"]
    assert call.usage.input_tokens > IMAGE_TOKENS
    assert call.cost == (call.usage.input_tokens + call.usage.output_tokens) / 1e6
    assert result.usage_summary.total_input_tokens >= call.usage.input_tokens
    _no_bytes_anywhere(result, exporter)


async def test_anthropic_gets_a_base64_image_block() -> None:
    def respond(body: dict[str, Any]) -> str:
        return ROOT if body.get("system") else "a grey square"

    provider, exporter = spans()
    with FakeAnthropicServer(respond, api_key=KEY) as server:
        async with RLM(
            "anthropic", anthropic_kwargs(server), tracer_provider=provider, trace_content=True
        ) as rlm:
            result = await rlm.acompletion(["a caption", Image.from_bytes(PICTURE)])
    assert result.response == "a grey square"
    assert server.bodies[1]["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": B64},
                },
            ],
        }
    ]
    (call,) = result.graph.records(NodeKind.LLM_CALL)
    assert call.usage is not None and call.usage.input_tokens > IMAGE_TOKENS
    _no_bytes_anywhere(result, exporter)
