"""What the model is told when its REPL process was stopped, killed or replaced: the
texts of the ``subprocess`` environment's block results and notes.

Every text that says the guest was replaced ends with `LOST` (what the fresh guest has
and what it lost), so the model reads one wording of it whatever killed the guest.
"""

from __future__ import annotations

from rlm_graph.contracts import ExecResult
from rlm_graph.repl.crossing import VALUE_BYTES

__all__ = [
    "LOST",
    "OUT_OF_STEP",
    "REQUEST_CANCELLED",
    "cpu_killed",
    "cpu_while_waiting",
    "describe_exit",
    "died_on_request",
    "idle_killed",
    "message_too_large",
    "restarted",
    "unanswered",
    "with_note",
]

LOST = (
    "[the REPL process was restarted: variables your code made are lost, and files it "
    "wrote may be; context, history and custom tools are loaded again]"
)


OUT_OF_STEP = (
    "[the REPL process was restarted and its variables lost: code wrote to the engine's "
    "pipe out of turn]"
)

REQUEST_CANCELLED = (
    "[the REPL process was killed: a request of the engine's to it (loading data) was "
    "cancelled before it answered]"
)


def unanswered(request: str, seconds: float) -> str:
    """A guest that did not answer the engine's ``request`` within ``seconds``."""
    return (
        f"[the REPL process was killed: it did not answer the engine's request ({request}) "
        f"within {seconds:g} s (code of an earlier block may have stopped or held its reader)]"
    )


def cpu_while_waiting(cpu_seconds: float) -> str:
    """A guest that used more than ``cpu_seconds`` while the engine waited on a request."""
    return (
        "[the REPL process was killed: while the engine waited for it to answer a request, "
        f"it used more than {cpu_seconds:g} CPU seconds (cpu_seconds): a thread or process "
        "an earlier block left running?]"
    )


def died_on_request(request: str) -> str:
    """A guest that died while the engine waited for its answer to ``request``."""
    return f"[the REPL process died while the engine was loading data into it ({request})]"


def restarted(said: str, error: str, answer: str) -> ExecResult:
    """The result of a block whose guest was killed and replaced: what happened, then
    what the fresh guest lost (`LOST`)."""
    return ExecResult(
        stderr=said + "\n" + LOST + "\n", error=error, restarted=True, answer_content=answer
    )


def cpu_killed(cpu_seconds: float, answer: str) -> ExecResult:
    said = (
        f"CPULimitExceeded: the block kept running past its CPU limit ({cpu_seconds:g} s) "
        "and its process was killed"
    )
    error = f"CPULimitExceeded: block exceeded {cpu_seconds:g} CPU seconds"
    return restarted(said, error, answer)


def message_too_large(limit_mb: float, answer: str, heavy: bool = False) -> ExecResult:
    said = (
        f"EnvironmentCrashed: the REPL process wrote more than {limit_mb:g} MB to the "
        "engine's pipe without ending a message (max_message_mb); it was killed. Write "
        "large results to a file in SCRATCH_DIR instead of printing them"
    )
    if heavy:  # the REPL's own calls are weighed before they are sent: this was forged
        said = (
            "EnvironmentCrashed: the REPL process wrote a line to the engine's pipe "
            f"weighing more than {limit_mb:g} MB (max_message_mb: its bytes, and "
            f"{VALUE_BYTES} for each JSON value in it), which the REPL's own calls never "
            "send; it was not read, and the process was killed"
        )
    error = f"EnvironmentCrashed: a message from the REPL process passed {limit_mb:g} MB"
    return restarted(said, error, answer)


def with_note(result: ExecResult, note: str | None) -> ExecResult:
    if note is None:
        return result
    text = note + "\n" + LOST + "\n"
    return result.model_copy(update={"stderr": text + result.stderr, "restarted": True})


def idle_killed(cpu_seconds: float) -> str:
    return (
        "[the REPL process was killed between blocks: a thread or process an earlier block "
        f"left running kept using CPU with no block running (more than {cpu_seconds:g} CPU "
        "seconds, cpu_seconds)]"
    )


def describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        return f"was killed by signal {-code}"
    return f"exited with code {code}"
