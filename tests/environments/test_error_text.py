"""A block's error and output as the engine keeps them: model code chooses what it raises,
and a ``subprocess`` guest's code may write a ``done`` of its own to the engine's pipe;
neither grows the engine by more than its limits (`rlm_graph.repl.clip`). Real guests."""

from __future__ import annotations

import pytest

from rlm_graph import RLM
from rlm_graph.graph import NodeKind, NodeRecord
from rlm_graph.repl.clip import ERROR_CHARS, ERROR_TYPE_CHARS, NOTE_ROOM
from rlm_graph.result import RLMChatCompletion
from tests.support.scripts import repl, root_and_sub

pytestmark = pytest.mark.processes

_HUGE_ERROR = "E = type('E' * 3_000_000, (Exception,), {})\nraise E('x' * 9_000_000)"

# The block's code writes, on the engine's pipe, the result of a block it never ran:
# 4 MB of each text (15 MB in all, within max_message_mb).
_FORGED = (
    "import gc, json, os\n"
    "proto = next(o for o in gc.get_objects() if type(o).__name__ == '_Protocol')\n"
    "result = {'stdout': 'o' * 4_000_000, 'stderr': 'e' * 4_000_000,\n"
    "          'error': 'T' * 3_000_000 + ': ' + 'm' * 4_000_000}\n"
    "os.write(proto._out.fileno(), (json.dumps({'type': 'done', 'result': result}) + '\\n').encode())\n"
)


def _blocks(result: RLMChatCompletion) -> list[NodeRecord]:
    return [node for node in result.graph if node.kind == NodeKind.REPL_BLOCK]


def _assert_error_clipped(record: NodeRecord) -> None:
    assert record.error is not None and len(record.error) < ERROR_CHARS + 100
    assert record.error_type is not None and len(record.error_type) < ERROR_TYPE_CHARS + 100


@pytest.mark.parametrize("environment", ["local", "subprocess"])
async def test_an_error_of_megabytes_is_kept_clipped(environment: str) -> None:
    """An exception whose type is named with 3 MB and whose message is 9 MB was kept whole
    on each block's node (its error and error type), its events and its journal: 40 such
    blocks grew the engine to 703 MB."""
    rlm = RLM(
        "scripted",
        {"respond": root_and_sub([repl(_HUGE_ERROR), repl("FINAL('after')")])},
        environment=environment,
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "after"
    failed = _blocks(result)[0]
    _assert_error_clipped(failed)
    assert failed.error_type is not None and failed.error_type.startswith("E" * 100)
    assert failed.error_type.endswith("more characters not kept]")


async def test_a_forged_result_is_clipped_as_the_guests_own_would_be() -> None:
    """A ``done`` written by the block's code carried 15 MB of stdout, stderr and error,
    kept whole (the output too, with ``record_content=True``)."""
    cap = 10_000
    rlm = RLM(
        "scripted",
        {"respond": root_and_sub([repl(_FORGED)] + [repl("FINAL('after')")] * 2)},
        environment="subprocess",
        environment_kwargs={"output_cap": cap},
        record_content=True,
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "after"
    forged = _blocks(result)[0]
    _assert_error_clipped(forged)
    output = forged.content_out
    assert output is not None and len(output) < 2 * (cap + NOTE_ROOM + 100)
    assert "more characters not kept" in output
