"""Images in the REPL: in ``context``, from bytes or files, to ``llm_query`` in both
environments; bad parts are the code's error; the direct path sends them as images."""

from __future__ import annotations

import pytest

from rlm_graph import RLM, NodeKind
from rlm_graph.contracts import MAX_IMAGE_BYTES, ChatRequest, Image
from tests.support.scripts import is_root_turn, repl, scripted

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8
GIF = b"GIF89a" + b"\x01" * 100


def seen(request: ChatRequest) -> str:
    """Sub-model: says what it was sent, part by part."""
    message = request.messages[-1]
    if not message.parts:
        return "text only"
    return " + ".join(
        f"{p.media_type}:{len(p.data)}" if isinstance(p, Image) else f"text:{p}"
        for p in message.parts
    )


def engine(code: str, environment: str = "local", **kwargs: object) -> RLM:
    def respond(request: ChatRequest) -> str:
        return repl(code) if is_root_turn(request) else seen(request)

    return RLM("scripted", {"respond": respond}, environment=environment, **kwargs)  # type: ignore[arg-type]


# Tools cross to the subprocess as JSON, so the bytes are handed over as lists of ints.
CODE = """
from pathlib import Path
with open("chart.gif", "wb") as f:  # the REPL's open writes in its scratch folder
    f.write(bytes(gif_bytes))
a = llm_query(["first", context[1]])
b = llm_query(["second", Path("chart.gif"), bytes(raw)])
FINAL(a + " | " + b)
"""


@pytest.mark.parametrize("environment", ["local", "subprocess"])
async def test_images_from_context_files_and_bytes_reach_the_sub_model(environment: str) -> None:
    rlm = engine(CODE, environment, custom_tools={"gif_bytes": list(GIF), "raw": list(PNG)})
    result = await rlm.acompletion(["a caption", Image.from_bytes(PNG)], root_prompt="look")
    assert result.response == (
        f"text:first + image/png:{len(PNG)} | "
        f"text:second + image/gif:{len(GIF)} + image/png:{len(PNG)}"
    )
    # The root model was told the context holds an image.
    task = scripted(rlm).requests[0].messages[1].content
    assert "1 of them images" in task


@pytest.mark.parametrize("environment", ["local", "subprocess"])
async def test_a_part_that_is_not_an_image_is_the_codes_error(environment: str) -> None:
    code = (
        "try:\n    llm_query(['x', b'not an image'])\n"
        "except ValueError as exc:\n    FINAL(str(exc))"
    )
    result = await engine(code, environment).acompletion("ctx")
    assert result.response == (
        "llm_query() prompt: part 1: the bytes are not a PNG, JPEG, GIF or WebP image"
    )
    assert list(result.graph.records(NodeKind.LLM_CALL)) == []


async def test_a_hostile_guest_cannot_pass_a_non_image_as_one() -> None:
    from rlm_graph.protocol.subcalls import prompt_parts

    with pytest.raises(ValueError, match="not a PNG"):
        prompt_parts(["x", {"media_type": "image/png", "data": "aGVsbG8="}])
    with pytest.raises(ValueError, match="not base64"):
        prompt_parts(["x", {"media_type": "image/png", "data": "@@@"}])


async def test_the_direct_path_sends_a_context_list_with_its_images() -> None:
    rlm = RLM(
        "scripted",
        {"respond": seen},
        direct_if_fits=True,
        models={"scripted": {"context_window": 10_000}},
    )
    result = await rlm.acompletion(["a caption", Image.from_bytes(PNG)], root_prompt="what?")
    assert result.response == f"text:what? + text:a caption + image/png:{len(PNG)}"
    (node,) = result.graph.records()
    assert node.id == "direct" and "~1,605 tokens" in (node.reason or "")
    assert "<image 2 KB png>" in node.input_preview


def test_an_image_past_the_limit_is_refused_with_the_limit_as_the_docs_give_it() -> None:
    """One byte past 20 MiB was refused as "21.0 MB; the most a call may carry is 21 MB":
    the limit read as larger than the image refused."""
    png = b"\x89PNG\r\n\x1a\n" + bytes(MAX_IMAGE_BYTES - 8)
    assert Image.from_bytes(png).data == png  # at the limit: taken
    with pytest.raises(ValueError) as refused:
        Image.from_bytes(png + b"\0")
    assert str(refused.value) == (
        "the image is 20,971,521 bytes; the most a call may carry is 20 MiB (20,971,520 bytes)"
    )
