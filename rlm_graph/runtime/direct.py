"""One-call answers: ``max_depth=0``, and the direct path (``RLM(direct_if_fits=True)``).

Both send the root model the question and the whole context in one plain call, without a
REPL, recorded as one ``llm_call`` node at depth 0. The direct path is taken only when
that call fits (`rlm_graph.protocol.direct.direct_fit`).

Invariants:
    - The decision is a `Fit`, whose ``reason`` names the numbers it compared; a taken
      path's node carries it as its ``reason``.
    - With an answer schema the call asks for structured output and its reply is
      validated; a mismatch fails the node (``SchemaMismatch``) and, on the direct path,
      hands the question to the RLM loop, which can correct an answer; ``max_depth=0``
      has no loop, so the completion keeps the refusal as its error.
"""

from __future__ import annotations

from typing import Any

from ..contracts import Message, ResponseSchema
from ..errors import SchemaMismatch
from ..graph import NodeKind, NodeRecord, preview
from ..limits import Tally
from ..protocol.direct import Fit, OneAnswer, direct_fit, task_parts, task_text
from ..protocol.prompts import schema_instructions
from ..protocol.schema import AnswerSchema
from .calls import ModelCall
from .context import Run

__all__ = ["Fit", "OneAnswer", "direct_fit", "one_call", "task_text"]


async def one_call(
    run: Run,
    context: Any,
    root_prompt: str | None,
    messages: list[Message],
    tally: Tally,
    *,
    node_id: str,
    params: Any = None,
    schema: AnswerSchema | None = None,
    note: str | None = None,
) -> OneAnswer:
    """Answer in one call of the root model, as the node ``node_id``.

    Appends the user message to ``messages`` (the completion's history). A reply that
    does not match ``schema`` fails the node (``SchemaMismatch``) and comes back with
    ``refused`` set.
    """
    parts = task_parts(context, root_prompt)
    if schema is not None:
        parts.append(schema_instructions(schema.describe(), repl=False))
    message = Message.of_parts("user", parts)
    messages.append(message)
    record = NodeRecord.fresh(
        id=node_id,
        kind=NodeKind.LLM_CALL,
        depth=0,
        input_preview=preview(message.content),
        reason=note,
    )
    wanted = ResponseSchema(name=schema.name, json_schema=schema.json_schema) if schema else None
    call = ModelCall(run, record, messages, params=params, tally=tally, response_schema=wanted)

    def answer(text: str) -> OneAnswer:
        """The reply, checked against the schema (live or replayed alike)."""
        if schema is None:
            return OneAnswer(text, raw=text)
        try:
            parsed = schema.parse_text(text)
        except SchemaMismatch as exc:
            record.fail("SchemaMismatch", str(exc))
            return OneAnswer(text, refused=f"SchemaMismatch: {exc}", raw=text)
        return OneAnswer(schema.dump_json(parsed), parsed, raw=text)

    async def body(rec: NodeRecord) -> OneAnswer:
        text = await call.text(rec)
        if run.record_content:
            rec.keep_content(message.content, text)
        return answer(text)

    return await run.execute(
        record, body, journal=lambda: call.journaled(keep=lambda a: a.raw, read=answer)
    )
