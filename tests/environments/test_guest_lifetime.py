"""What a guest leaves running between blocks: CPU the engine watches over the guest's
whole life, not only inside a block, and requests of the engine's (loading data) it
never answers. Real guest processes."""

from __future__ import annotations

import textwrap

import pytest
import trio

from rlm_graph_subprocess import SubprocessEnvironment
from tests.support.guests import alive, engine, feedback
from tests.support.scripts import repl

pytestmark = pytest.mark.processes

SPIN_THREAD = (
    "import threading\n"
    "def spin():\n"
    "    while True:\n"
    "        pass\n"
    "threading.Thread(target=spin, daemon=True).start()\n"
)
SPIN_PROCESS = (
    "import subprocess\n"
    "subprocess.Popen(['sh', '-c', 'while :; do :; done'], start_new_session=True)\n"
)


@pytest.mark.parametrize("leftover", [SPIN_THREAD, SPIN_PROCESS], ids=["thread", "process"])
async def test_cpu_a_block_leaves_running_is_stopped_between_blocks(leftover: str) -> None:
    env = SubprocessEnvironment(bridge=None, cpu_seconds=1)  # type: ignore[arg-type]
    try:
        await env.start()
        await env.add_context("the document", 0)
        done = await env.execute("kept = 1\n" + leftover)
        assert done.error is None, done
        first = env.guest_pids[0]
        # No block runs: only the watch over idle guests can stop what was left behind.
        with trio.fail_after(120):
            while alive(first):
                await trio.sleep(0.1)
        result = await env.execute("print(globals().get('kept'), context)")
        assert "left running kept using CPU with no block running" in result.stderr
        assert "variables your code made are lost" in result.stderr
        assert result.stdout.strip() == "None the document"  # state lost, context back
        assert env.restarts == 1 and result.restarted
    finally:
        await env.aclose()


async def test_an_idle_guest_is_not_charged_for_the_engines_requests() -> None:
    # Loading a context costs the guest CPU; that is work for the engine, not idle CPU.
    env = SubprocessEnvironment(bridge=None, cpu_seconds=1)  # type: ignore[arg-type]
    try:
        await env.start()
        for index in range(3):
            await env.add_context([{"n": i, "text": "x" * 50} for i in range(200_000)], index)
        result = await env.execute("print(len(context_2))")
        assert result.stdout.strip() == "200000" and env.restarts == 0
    finally:
        await env.aclose()


def _held_reset(then: str = "") -> str:
    """A block that replaces the guest's handler of the engine's requests so that it
    never answers ``reset_answer`` (doing ``then`` first), then gives an answer the
    schema refuses: the engine resets ``answer`` and waits."""
    return (
        "import gc, os, threading\n"
        "guest = next(o for o in gc.get_objects() if type(o).__name__ == 'Guest')\n"
        "handle = guest.handle\n"
        "def held(message):\n"
        "    if type(message).__name__ == 'ResetAnswer':\n"
        f"{textwrap.indent(then, '        ')}"
        "        threading.Event().wait()\n"
        "    return handle(message)\n"
        "guest.handle = held\n"
        "FINAL({'wrong': 1})\n"
    )


_SPIN_TWO = "for _ in range(2):\n    if os.fork() == 0:\n        while True:\n            pass\n"
_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


async def test_a_guest_that_never_answers_a_request_is_replaced_at_its_deadline() -> None:
    """Only blocks had a deadline: a guest whose code kept it from answering a data
    request (here ``reset_answer``) held the run for good, whatever ``timeout`` said."""
    rlm = engine(
        [repl(_held_reset()), repl("print('after')"), repl("FINAL({'n': 1})")],
        environment_kwargs={"timeout": 1, "start_timeout": 5},
    )
    with trio.fail_after(60):
        result = await rlm.acompletion("ctx", schema=_SCHEMA)
    assert result.parsed == {"n": 1}
    told = feedback(rlm, 2)
    assert "did not answer the engine's request (ResetAnswer) within 5 s" in told
    assert "variables your code made are lost" in told


async def test_cpu_burnt_while_the_engine_waits_on_a_request_is_held_to_cpu_seconds() -> None:
    """A request was a busy spell with no watch: neither the block's CPU watchdog nor
    the idle charge applied, and processes the guest forked burnt CPU without limit."""
    # The watch ends the guest once the two children have had cpu_seconds + _CPU_GRACE
    # (3 s) of CPU; how long that takes on the wall clock is the machine's to say. The
    # guest's session is one scheduling group (autogroup), so on a loaded machine the
    # two share a small slice of it: with the request's deadline at its default of 30 s
    # they got under 3 s of CPU by then and the deadline, not the watch, ended the guest.
    # The deadline is moved out of reach; the feedback says which of the two fired.
    rlm = engine(
        [repl(_held_reset(_SPIN_TWO)), repl("print('after')"), repl("FINAL({'n': 1})")],
        environment_kwargs={"cpu_seconds": 1, "start_timeout": 120},  # no timeout
    )
    with trio.fail_after(600):
        result = await rlm.acompletion("ctx", schema=_SCHEMA)
    assert result.parsed == {"n": 1}
    told = feedback(rlm, 2)
    assert "it used more than 1 CPU seconds (cpu_seconds)" in told
    assert "did not answer the engine's request" not in told


async def test_a_guest_whose_code_ends_it_on_a_request_is_replaced_and_the_run_goes_on() -> None:
    """A guest that died on a data request ended the run (`EnvironmentCrashed`), even
    where the model's code killed it: now a fresh guest gets the data, as after a crash
    in a block."""
    rlm = engine(
        [repl(_held_reset("os._exit(1)\n")), repl("print('after')"), repl("FINAL({'n': 1})")]
    )
    with trio.fail_after(60):
        result = await rlm.acompletion("ctx", schema=_SCHEMA)
    assert result.parsed == {"n": 1}
    assert "died while the engine was loading data into it (ResetAnswer)" in feedback(rlm, 2)
