"""The RLM paper's four methods: ``rlm``, ``rlm-no-subcalls``, ``base``, ``summary``.

- ``rlm``: the RLM with its REPL and sub-calls (``max_depth`` 1 unless the evaluation
  sets it): ``llm_query`` and friends go to the sub-model.
- ``rlm-no-subcalls``: the paper's ablation, the REPL without any sub-call: the
  environment is built with ``subcalls=False`` (the four functions are not in its
  namespace) and the system prompt says there is no other model.
- ``base``: one call of the root model with the question and the whole context
  (``max_depth=0``); recorded as ``does_not_fit`` without a call only when the model's
  window is known and the context's estimate exceeds it.
- ``summary``: the iterative summarising agent: the sub-model reads the context a chunk
  at a time, each time rewriting its running notes; the root model answers from the
  final notes (the paper used GPT-5-nano for the notes and GPT-5 for the answer).

Cost estimates are rough floors from the price table: the context read once by the
model that reads it, plus an allowance per item for an RLM's turns (`TURN_INPUT`,
`TURN_OUTPUT`); real costs have a long tail (the paper's Figure 3).
"""

from __future__ import annotations

import json
from typing import Any

from rlm_graph.eval import Call, EvalItem, MethodSetup, NotRun, Solver, context_tokens, item_call

__all__ = ["BaseMethod", "NoSubcallsMethod", "RLMMethod", "SummaryMethod"]

TURN_INPUT = 100_000
"""Input tokens an RLM's root model is expected to read per item (ten turns of ~10k)."""
TURN_OUTPUT = 10_000
"""Output tokens an RLM's root model is expected to write per item."""
ANSWER_OUTPUT = 1_000
"""Output tokens of one plain answer."""
NOTES_TOKENS = 2_000
"""The size the summary agent's notes are asked to stay under, in tokens."""
DEFAULT_CHUNK_TOKENS = 100_000
"""The summary agent's chunk when the sub-model's window is not in the model table."""

NO_SUBCALLS_PROMPT = """\
You are a Recursive Language Model working without sub-models. You answer a question \
about a context that may be far too long to read at once. The context is not in this \
conversation: it is the variable `context` in a persistent Python REPL, and you work on \
it by writing code.

Write code in fenced blocks that start with ```repl and end with ```. Every block of a \
reply runs, in order, in the same namespace; variables persist between turns. After each \
reply you see what your code printed (only printed output and the value of a final bare \
expression are shown; long output is cut, so print summaries and slices, not whole \
documents).

In the REPL you have:
- `context`: the data (a str, list or dict).
- `SHOW_VARS()`: the variables you have created, with their types.
- `answer`: a dict. Put your final answer in `answer["content"]`, then set \
`answer["ready"] = True` to finish. `FINAL(value)` and `FINAL_VAR("variable_name")` do \
the same in one call.
There is no other model to ask: no `llm_query` and no `rlm_query`. Read and search the \
context with code (slices, `str.find`, regular expressions, counting, parsing), and print \
the parts you need to read.
{custom_tools_section}
How to work:
1. Look before you answer: print the type, the length and a few slices of `context`.
2. Narrow down with code: find the parts that matter and print only those.
3. Check what you have (print it) before you answer; do not set `answer["ready"]` in \
the same block that first looks at the data.
"""

_STEP = """\
You are reading a long context one part at a time, keeping notes that will be used \
later to answer a question. You will not see this part again.

Question: {question}

Your notes so far:
{notes}

Below is part {part} of {parts} of the context. Rewrite your notes: keep everything from \
your notes and from this part that could help answer the question (facts, names, numbers, \
running counts), and drop the rest. Stay under {words:,} words. Reply with the notes only."""

_FINAL = """\
The context below is the notes taken while reading a long document, part by part, to \
answer a question. Answer the question from them.

Question: {question}"""


def _repl_estimate(setup: MethodSetup, reader: str, tokens: int) -> float | None:
    root = setup.price(setup.root_model, TURN_INPUT, TURN_OUTPUT)
    read = setup.price(reader, tokens, tokens // 50)
    return None if root is None or read is None else root + read


class RLMMethod:
    """The RLM: REPL and sub-calls to the sub-model."""

    name = "rlm"
    description = "RLM: the REPL with llm_query to the sub-model (depth 1)"

    def rlm_kwargs(self, setup: MethodSetup) -> dict[str, dict[str, Any]]:
        return {"root": setup.root_kwargs(max_depth=setup.rlm_kwargs.get("max_depth", 1))}

    def solve(self, item: EvalItem, setup: MethodSetup) -> Solver:
        return (yield item_call(item))

    def estimate(self, item: EvalItem, tokens: int, setup: MethodSetup) -> float | None:
        return _repl_estimate(setup, setup.sub_model, tokens)


class NoSubcallsMethod:
    """The ablation: the REPL, and no model to call from it."""

    name = "rlm-no-subcalls"
    description = "RLM without sub-calls: the REPL alone (no llm_query, no rlm_query)"

    def rlm_kwargs(self, setup: MethodSetup) -> dict[str, dict[str, Any]]:
        environment = dict(setup.rlm_kwargs.get("environment_kwargs") or {})
        environment["subcalls"] = False
        return {
            "root": setup.root_kwargs(
                environment_kwargs=environment,
                custom_system_prompt=NO_SUBCALLS_PROMPT,
            )
        }

    def solve(self, item: EvalItem, setup: MethodSetup) -> Solver:
        return (yield item_call(item))

    def estimate(self, item: EvalItem, tokens: int, setup: MethodSetup) -> float | None:
        return setup.price(setup.root_model, TURN_INPUT, TURN_OUTPUT)


class BaseMethod:
    """One call of the root model with the whole context."""

    name = "base"
    description = "the base model: one call with the question and the whole context"

    def rlm_kwargs(self, setup: MethodSetup) -> dict[str, dict[str, Any]]:
        return {"root": setup.root_kwargs(max_depth=0)}

    def solve(self, item: EvalItem, setup: MethodSetup) -> Solver:
        window = setup.window(setup.root_model)
        if window is not None:
            tokens = context_tokens(item.load_context(), item.question)
            if tokens > window:
                return NotRun(
                    stop_reason="does_not_fit",
                    note=f"~{tokens:,} tokens of question and context exceed the {window:,}-token "
                    f"window of {setup.root_model!r}",
                )
        return (yield item_call(item))

    def estimate(self, item: EvalItem, tokens: int, setup: MethodSetup) -> float | None:
        window = setup.window(setup.root_model)
        if window is not None and tokens > window:
            return 0.0
        return setup.price(setup.root_model, tokens, ANSWER_OUTPUT)


def _text(context: Any) -> str:
    if isinstance(context, str):
        return context
    if isinstance(context, list):
        return "\n\n".join(
            doc if isinstance(doc, str) else json.dumps(doc, default=str) for doc in context
        )
    return json.dumps(context, default=str)


def chunk_bounds(text: str, size: int) -> list[tuple[int, int]]:
    """``(start, end)`` of chunks of at most ``size`` characters, cut at a blank line or a
    line end in the chunk's second half when there is one."""
    bounds = []
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            for mark in ("\n\n", "\n", ". "):
                cut = text.rfind(mark, start + size // 2, end)
                if cut > 0:
                    end = cut + len(mark)
                    break
        bounds.append((start, end))
        start = end
    return bounds or [(0, 0)]


class SummaryMethod:
    """The iterative summarising agent: notes over chunks, then an answer from the notes."""

    name = "summary"
    description = (
        "summary agent: the sub-model keeps notes chunk by chunk; the root answers from them"
    )

    def rlm_kwargs(self, setup: MethodSetup) -> dict[str, dict[str, Any]]:
        return {"sub": setup.sub_kwargs(max_depth=0), "root": setup.root_kwargs(max_depth=0)}

    @staticmethod
    def chunk_tokens(setup: MethodSetup) -> int:
        window = setup.window(setup.sub_model)
        if window is None:
            return DEFAULT_CHUNK_TOKENS
        return max(1_024, int(window * 0.6) - 2 * NOTES_TOKENS)

    def solve(self, item: EvalItem, setup: MethodSetup) -> Solver:
        # Only the chunks' bounds are kept between calls; the context is read again for
        # each one, so a long evaluation does not hold every item's context at once.
        bounds = chunk_bounds(_text(item.load_context()), self.chunk_tokens(setup) * 4)
        notes = "(none yet)"
        for part, (start, end) in enumerate(bounds, start=1):
            chunk = _text(item.load_context())[start:end]
            query = _STEP.format(
                question=item.question,
                notes=notes,
                part=part,
                parts=len(bounds),
                words=NOTES_TOKENS * 3 // 4,
            )
            notes = yield Call(query=query, context=chunk, role="sub")
        return (yield Call(query=_FINAL.format(question=item.question), context=notes, role="root"))

    def estimate(self, item: EvalItem, tokens: int, setup: MethodSetup) -> float | None:
        parts = max(1, -(-tokens // self.chunk_tokens(setup)))
        notes = setup.price(setup.sub_model, tokens + parts * NOTES_TOKENS, parts * NOTES_TOKENS)
        answer = setup.price(setup.root_model, NOTES_TOKENS, ANSWER_OUTPUT)
        return None if notes is None or answer is None else notes + answer
