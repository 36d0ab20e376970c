"""Benchmark scenarios: what the root model writes, what sub-calls answer, what is right.

Pure standard library, because three processes import it: the fake OpenAI server
(`bench/fake_server.py`, which plays every model over HTTP), our own runner
(`bench/run.py`, which also plays them in-process through the scripted provider) and the
reference driver (`bench/reference_driver.py`, run by the reference library's own venv).

A scenario is named by a key such as ``"fanout"`` or ``"overhead-batched:1000"``; the
key is also the model name every engine asks for, which is how the fake server knows
which script to play. Who is asking is read off the messages, the same way for both
engines:

    - a sub-call (``llm_query``) is a conversation without a system message;
    - a root turn has a system message and, somewhere, the ``[bench run=...]`` marker
      that the runner puts in ``root_prompt``;
    - a child completion's turn (``rlm_query`` at depth 2) has a system message and no
      marker (children get no ``root_prompt``; their task is their ``context``).

The turn number is one more than the number of assistant messages so far. The code the
scripted root model writes uses only the REPL protocol both engines share:
``llm_query``, ``llm_query_batched``, ``rlm_query_batched``, ``context`` and the
``answer`` dict.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ROOT_LATENCY",
    "SUB_LATENCY",
    "Scenario",
    "get",
    "marker",
    "model_reply",
    "run_id_of",
    "tokens",
]

ROOT_LATENCY = 0.1  # seconds per root (or child) turn in the timed scenarios
SUB_LATENCY = 0.2  # seconds per sub-call in the timed scenarios

_MARKER = re.compile(r"\[bench run=([\w.-]+)\]")


def marker(run_id: str) -> str:
    """The tag a runner puts in ``root_prompt`` so the server can tell root turns apart."""
    return f"[bench run={run_id}]"


def run_id_of(messages: list[dict[str, str]]) -> str | None:
    for message in messages:
        found = _MARKER.search(message.get("content") or "")
        if found:
            return found.group(1)
    return None


def repl(code: str) -> str:
    return f"Working in the REPL.\n```repl\n{code.strip()}\n```\n"


ANSWER_TOTAL = 'answer["content"] = str(total)\nanswer["ready"] = True'


@dataclass(frozen=True)
class Scenario:
    """One benchmark scenario.

    Attributes:
        key: its name, and the model name the engines ask for.
        root_turns: the root model's code, turn by turn (the last repeats).
        child_turns: a child completion's code, turn by turn (depth-2 scenarios).
        expected: the right answer (``response``), as a string.
        ideal: the fastest possible run in seconds given the latencies and the limits
            (the critical path of model latency alone); ``None`` where latency is zero.
        sub_calls: how many plain sub-calls a correct run makes.
        root_latency, sub_latency: seconds the model takes per turn and per sub-call.
        max_depth: the engines' ``max_depth``.
        description: one line for the report.
    """

    key: str
    root_turns: tuple[str, ...]
    expected: str
    sub_calls: int
    description: str
    ideal: float | None = None
    child_turns: tuple[str, ...] = ()
    root_latency: float = ROOT_LATENCY
    sub_latency: float = SUB_LATENCY
    max_depth: int = 1
    extra: dict[str, Any] = field(default_factory=dict)
    first_token: float = 0.0
    """Seconds to a root reply's first token, where root replies stream (``rate``)."""
    rate: float | None = None
    """Root replies are generated at this many tokens a second (None: all at once, after
    ``root_latency``); streamed when asked, else sent whole once generated."""


_TOKEN = re.compile(r"\s*\S{1,4}|\s+")


def tokens(text: str) -> list[str]:
    """A reply cut into tokens the way the fake servers stream it (about four characters:
    a run of spaces goes with the word after it)."""
    return _TOKEN.findall(text)


def generation(scenario: Scenario, text: str) -> tuple[float, float]:
    """How long a root reply takes to generate at ``scenario.rate``: to the end of its
    first ```repl block (the token that ends the closing fence line), and in all."""
    pieces = tokens(text)
    gap = 1.0 / scenario.rate if scenario.rate else 0.0
    start = text.find("```repl")
    close = text.find("```\n", start + 7) + 4 if start >= 0 else len(text)
    seen, upto = 0, len(pieces)
    for index, piece in enumerate(pieces, start=1):
        seen += len(piece)
        if seen >= close:
            upto = index
            break
    return scenario.first_token + upto * gap, scenario.first_token + len(pieces) * gap


def sub_answer(prompt: str) -> str:
    """What every sub-call answers: ``sq n`` -> n*n, ``next n`` -> 2n+1."""
    verb, _, arg = prompt.strip().partition(" ")
    if verb == "sq":
        n = int(arg)
        return str(n * n)
    if verb == "next":
        return str(2 * int(arg) + 1)
    return f"unknown sub-call {prompt[:40]!r}"


def _fanout() -> Scenario:
    code = """
r = llm_query_batched([f"sq {i}" for i in range(64)])
total = sum(int(x) for x in r)
print(total)
"""
    return Scenario(
        key="fanout",
        root_turns=(repl(code), repl(ANSWER_TOTAL)),
        expected=str(sum(i * i for i in range(64))),
        sub_calls=64,
        ideal=2 * ROOT_LATENCY + 4 * SUB_LATENCY,  # 64 slots, 16 at a time: 4 waves
        description="64 sub-calls in one llm_query_batched, batch limit 16, 200 ms each",
    )


def _chain() -> Scenario:
    code = """
x = 1
for _ in range(8):
    x = int(llm_query(f"next {x}"))
total = x
print(total)
"""
    x = 1
    for _ in range(8):
        x = 2 * x + 1
    return Scenario(
        key="chain",
        root_turns=(repl(code), repl(ANSWER_TOTAL)),
        expected=str(x),
        sub_calls=8,
        ideal=2 * ROOT_LATENCY + 8 * SUB_LATENCY,
        description="8 llm_query calls, each needing the previous answer",
    )


def _children(key: str, leaves: int) -> Scenario:
    """A root ``rlm_query_batched`` of 8 children (4 in flight: 2 waves), each child one
    turn whose block is an ``llm_query_batched`` of ``leaves`` (16 at a time)."""
    root = """
parts = rlm_query_batched([f"part {k}" for k in range(8)])
total = sum(int(p) for p in parts)
print(total)
"""
    child = f"""
k = int(context.split()[1])
r = llm_query_batched([f"sq {{k * {leaves} + i}}" for i in range({leaves})])
answer["content"] = str(sum(int(x) for x in r))
answer["ready"] = True
"""
    waves = -(-leaves // 16)  # a child's leaves, 16 at a time (batch_max_concurrent)
    return Scenario(
        key=key,
        root_turns=(repl(root), repl(ANSWER_TOTAL)),
        child_turns=(repl(child),),
        expected=str(sum(i * i for i in range(8 * leaves))),
        sub_calls=8 * leaves,
        ideal=2 * ROOT_LATENCY + 2 * (ROOT_LATENCY + waves * SUB_LATENCY),
        max_depth=2,
        description=f"rlm_query_batched of 8 children (4 at a time), each llm_query_batched of {leaves}",
    )


def _depth2() -> Scenario:
    return _children("depth2", 32)


def _recursive() -> Scenario:
    # A wave's 4 children x 8 leaves in flight together need a provider limit of 32.
    return _children("recursive", 8)


def _multibatch() -> Scenario:
    code = """
a = llm_query_batched([f"sq {i}" for i in range(16)])
b = llm_query_batched([f"sq {int(x) % 97}" for x in a])
c = llm_query_batched([f"sq {int(x) % 89}" for x in b])
d = llm_query_batched([f"sq {int(x) % 83}" for x in c])
total = sum(int(x) for x in d)
print(total)
"""
    values = [i * i for i in range(16)]
    for mod in (97, 89, 83):
        values = [(v % mod) ** 2 for v in values]
    return Scenario(
        key="multibatch",
        root_turns=(repl(code), repl(ANSWER_TOTAL)),
        expected=str(sum(values)),
        sub_calls=64,
        ideal=2 * ROOT_LATENCY + 4 * SUB_LATENCY,
        description="4 dependent llm_query_batched of 16 in one block",
    )


def _overhead(style: str, n: int) -> Scenario:
    if style == "batched":
        code = f"""
r = llm_query_batched([f"sq {{i}}" for i in range({n})])
total = sum(int(x) for x in r)
{ANSWER_TOTAL}
"""
        what = f"{n} sub-calls in one llm_query_batched"
    else:
        code = f"""
total = 0
for i in range({n}):
    total += int(llm_query(f"sq {{i}}"))
{ANSWER_TOTAL}
"""
        what = f"{n} llm_query calls one after another"
    return Scenario(
        key=f"overhead-{style}:{n}",
        root_turns=(repl(code),),
        expected=str(sum(i * i for i in range(n))),
        sub_calls=n,
        root_latency=0.0,
        sub_latency=0.0,
        description=f"{what}, zero latency, one root turn",
    )


def _first() -> Scenario:
    return Scenario(
        key="first",
        root_turns=(repl('total = "ok"\n' + ANSWER_TOTAL),),
        expected="ok",
        sub_calls=0,
        root_latency=0.0,
        sub_latency=0.0,
        description="one root turn that answers at once",
    )


REAL_FIRST_TOKEN = 0.5  # seconds to a root reply's first token
REAL_RATE = 50.0  # root tokens generated per second
REAL_SUB = 1.5  # seconds per sub-call
COMMENTARY = (
    "While the sub-model reads that part, here is how the pieces will fit: each part gives "
    "a total, the totals add up, and the last turn checks the sum against the context "
    "before it answers, so a wrong part shows up as a mismatch rather than a silent error."
)


def _realistic(turns: int) -> Scenario:
    """A trajectory like a real run: each root reply is a block of code and then some
    commentary, streamed at 50 tokens/s; each block waits for a round of sub-calls."""
    replies, total = [], 0
    for i in range(1, turns):
        code = f"""
parts = llm_query_batched([f"sq {{j}}" for j in range({8 * i}, {8 * i + 8})])
total_{i} = sum(int(p) for p in parts)
print("part {i}:", total_{i}, "|", context[{600 * (i - 1)}:{600 * i}])
"""
        total += sum(j * j for j in range(8 * i, 8 * i + 8))
        replies.append(
            f"Turn {i}: part {i} of the context goes to the sub-model.\n```repl\n"
            f"{code.strip()}\n```\n{COMMENTARY}\n"
        )
    finish = " + ".join(f"total_{i}" for i in range(1, turns))
    replies.append(f"All parts are in.\n```repl\ntotal = {finish}\n{ANSWER_TOTAL}\n```\nDone.\n")
    return Scenario(
        key=f"realistic:{turns}",
        root_turns=tuple(replies),
        expected=str(total),
        sub_calls=8 * (turns - 1),
        root_latency=REAL_FIRST_TOKEN,
        sub_latency=REAL_SUB,
        first_token=REAL_FIRST_TOKEN,
        rate=REAL_RATE,
        extra={"max_iterations": turns + 2, "context_chars": 600 * turns},
        description=(
            f"{turns} root turns, each a block and commentary at {REAL_RATE:g} tokens/s "
            f"(first token after {REAL_FIRST_TOKEN:g} s), 8 sub-calls of {REAL_SUB:g} s per block"
        ),
    )


def _batch(n: int) -> Scenario:
    """One completion of a batch (bench/batch.py): ``n`` sub-calls in one batch over the
    item's own context (an integer), so every item's answer is its own."""
    code = f"""
base = int(context)
r = llm_query_batched([f"sq {{base + i}}" for i in range({n})])
total = sum(int(x) for x in r)
{ANSWER_TOTAL}
"""
    return Scenario(
        key=f"batch:{n}",
        root_turns=(repl(code),),
        expected="per item: sum((context + i) ** 2 for i in range(n))",
        sub_calls=n,
        root_latency=0.1,
        sub_latency=0.1,
        ideal=0.2,  # one root turn, then the n sub-calls side by side
        description=f"one root turn, then {n} sub-calls in one batch, 100 ms per call",
    )


_FIXED: dict[str, Callable[[], Scenario]] = {
    "fanout": _fanout,
    "chain": _chain,
    "depth2": _depth2,
    "multibatch": _multibatch,
    "recursive": _recursive,
    "first": _first,
}

TIMED = ("fanout", "chain", "depth2", "multibatch", "recursive")


@functools.cache
def get(key: str) -> Scenario:
    """The scenario for a key (``"fanout"``, ``"overhead-batched:1000"`` ...)."""
    if key in _FIXED:
        return _FIXED[key]()
    name, _, arg = key.partition(":")
    if name in ("overhead-batched", "overhead-sequential") and arg.isdigit():
        return _overhead(name.split("-")[1], int(arg))
    if name == "batch" and arg.isdigit():
        return _batch(int(arg))
    if name == "realistic" and arg.isdigit() and int(arg) >= 2:
        return _realistic(int(arg))
    raise KeyError(f"no bench scenario {key!r}; known: {sorted(_FIXED)} and overhead-batched:N")


def model_reply(key: str, messages: list[dict[str, str]]) -> tuple[str, float]:
    """Play every model of scenario ``key``: the reply text and the latency to simulate."""
    scenario = get(key)
    if not any(m.get("role") == "system" for m in messages):
        prompt = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        return sub_answer(prompt), scenario.sub_latency
    turn = sum(1 for m in messages if m.get("role") == "assistant") + 1
    turns = scenario.root_turns if run_id_of(messages) is not None else scenario.child_turns
    if not turns:
        return repl('answer["content"] = "unexpected child"\nanswer["ready"] = True'), 0.0
    return turns[min(turn, len(turns)) - 1], scenario.root_latency
