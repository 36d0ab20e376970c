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
    "cpu_killed",
    "describe_exit",
    "idle_killed",
    "message_too_large",
    "restarted",
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
