"""What a guest leaves running between blocks: CPU the engine watches over the guest's
whole life, not only inside a block. Real guest processes."""

from __future__ import annotations

import pytest
import trio

from rlm_graph_subprocess import SubprocessEnvironment
from tests.support.guests import alive

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
