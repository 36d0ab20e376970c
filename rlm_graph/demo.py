"""The offline demo: a needle in a 2 MB haystack, found by a scripted RLM.

Nothing here calls a real model. The ``scripted`` provider plays both parts:
    - a root model that behaves as a trained RLM would: look at the context, chunk it,
      ask a sub-model about every chunk at once with ``llm_query_batched``, combine, answer;
    - a sub-model that really reads its chunk (a regex over the prompt), so the answer
      is found, not hard-coded.
Latency is simulated (``trio.sleep``), so the numbers show the scheduler at work: the
chunks are read in parallel under the batch and provider limits.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from .contracts import ChatRequest

__all__ = ["DemoSetup", "build_document", "demo_rlm_kwargs"]

_WORDS = (
    "ledger river harbor copper lantern orchard meadow signal archive quarry beacon "
    "granite willow compass thunder velvet saffron marble cinder falcon mosaic tundra"
).split()

QUESTION = "What is the vault access code mentioned somewhere in the document?"
_FACT = re.compile(r"vault access code is ([A-Z0-9]{4}-[A-Z0-9]{4})")


@dataclass(frozen=True)
class DemoSetup:
    document: str
    code: str
    position: int


def build_document(size: int = 2_000_000, seed: int = 7) -> DemoSetup:
    """A deterministic document of about ``size`` characters with one hidden fact."""
    rng = random.Random(seed)
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
    code = (
        "".join(rng.choice(alphabet) for _ in range(4))
        + "-"
        + "".join(rng.choice(alphabet) for _ in range(4))
    )
    lines = []
    total = 0
    number = 0
    while total < size:
        number += 1
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 16)))
        line = f"Entry {number}: {words}."
        lines.append(line)
        total += len(line) + 1
    where = rng.randint(len(lines) // 3, 2 * len(lines) // 3)
    lines.insert(where, f"Memo {where}: for the record, the vault access code is {code}.")
    document = "\n".join(lines)
    return DemoSetup(document=document, code=code, position=document.index(code))


_PROBE = """print(type(context).__name__, len(context))
print(context[:300])"""

_MAP = """size, overlap = 100_000, 200
chunks = [context[i:i + size] for i in range(0, len(context), size - overlap)]
prompts = [
    "Find the vault access code in this text. Reply with the code only, or NONE.\\n\\n" + c
    for c in chunks
]
found = llm_query_batched(prompts)
hits = sorted({f.strip() for f in found if f.strip() != "NONE" and not f.startswith("[ERROR]")})
print(f"{len(chunks)} chunks read, hits: {hits}")"""

_ANSWER = """answer["content"] = hits[0] if len(hits) == 1 else "not found: " + repr(hits)
answer["ready"] = True"""


def _fence(code: str, note: str) -> str:
    return f"{note}\n```repl\n{code}\n```"


def root_model(request: ChatRequest) -> str:
    """A scripted root model: probe, map over chunks, answer."""
    turn = sum(1 for m in request.messages if m.role == "assistant") + 1
    if turn == 1:
        return _fence(_PROBE, "First, a look at the context.")
    if turn == 2:
        return _fence(_MAP, "A long text: I will split it and ask about every chunk at once.")
    return _fence(_ANSWER, "Exactly one chunk held the code.")


def sub_model(request: ChatRequest) -> str:
    """A scripted sub-model that reads its chunk."""
    found = _FACT.search(request.prompt)
    return found.group(1) if found else "NONE"


def demo_rlm_kwargs(latency: float = 0.2, max_concurrent: int = 16) -> dict[str, object]:
    """Keywords for `RLM` that run the demo's scripted models."""
    return {
        "backend": "scripted",
        "backend_kwargs": {
            "model_name": "scripted-root",
            "respond": root_model,
            "latency": latency,
        },
        # Sub-calls (depth >= 1) go to the first of other_backends: a "cheaper" model.
        "other_backends": ["scripted"],
        "other_backend_kwargs": [
            {
                "model_name": "scripted-sub",
                "respond": sub_model,
                "latency": latency,
                "max_concurrent": max_concurrent,
            }
        ],
        "environment": "local",
        "max_iterations": 6,
    }
