"""Node events at the edges: a Ctrl-C outside a node's body, a listener that raises."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from typing import Any

import pytest

from rlm_graph import RLM, Engine
from rlm_graph.errors import ConfigError
from rlm_graph.events import NodeFinished, NodeStarted
from rlm_graph.tracing.spans import NodeTracer
from tests.support.scripts import repl, root_and_sub


def test_a_keyboard_interrupt_entering_a_nodes_span_finishes_it_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The signal can land between a node's start and its body (here: as a sub-call's
    span opens, in a block of the local environment): the interrupt reaches the caller
    (the model's code never sees it as its own), and the node_finished event says
    cancelled, never running (which the progress line counted as failed)."""
    real = NodeTracer.node_span

    @contextlib.contextmanager
    def interrupted(self: NodeTracer, record: Any, parent_id: str | None) -> Iterator[None]:
        if record.kind.value == "llm_call":
            raise KeyboardInterrupt
        with real(self, record, parent_id):
            yield

    monkeypatch.setattr(NodeTracer, "node_span", interrupted)
    events: list[Any] = []
    rlm = RLM(
        "scripted",
        {"respond": root_and_sub([repl("FINAL(llm_query('q'))")])},
        listeners=[events.append],
    )
    with pytest.raises(KeyboardInterrupt):
        rlm.completion("ctx")
    finished = [e for e in events if isinstance(e, NodeFinished)]
    assert finished and all(e.status != "running" for e in finished)
    assert [e.status for e in finished if e.kind == "llm_call"] == ["cancelled"]


@pytest.mark.parametrize("error", [ValueError("dashboard down"), SystemExit("dashboard down")])
def test_a_listener_that_raises_is_named_in_the_log_and_the_run_goes_on(
    caplog: pytest.LogCaptureFixture, error: BaseException
) -> None:
    """Even ``sys.exit()`` in a listener is the listener's failure, as in an observer
    (it ended the run, and every result was lost)."""
    seen: list[Any] = []

    def dashboard(event: Any) -> None:
        raise error

    rlm = RLM(
        "scripted",
        {"respond": root_and_sub([repl("FINAL('ok')")])},
        listeners=[dashboard, seen.append],
    )
    with caplog.at_level("ERROR", logger="rlm_graph"):
        assert rlm.completion("ctx").response == "ok"
    assert seen and seen[-1].type == "run_finished"  # the other listener got every event
    failures = [r.getMessage() for r in caplog.records if "failed on node" in r.getMessage()]
    assert failures and all("listener" in m and "dashboard" in m for m in failures)


def _interrupting(request: Any) -> str:
    """A sub-call's provider met by a Ctrl-C (the engine's, not the model's code's)."""
    if "boom" in request.prompt:
        raise KeyboardInterrupt
    return "fine"


@pytest.mark.parametrize(
    "code",
    [
        "import contextlib\nwith contextlib.suppress(BaseException):\n    llm_query('boom')\n"
        "FINAL('survived')",
        "from concurrent.futures import ThreadPoolExecutor\n"
        "with ThreadPoolExecutor(3) as pool:\n"
        "    out = list(pool.map(llm_query, ['slow one', 'boom', 'slow two']))\n"
        "FINAL(str(out))",
    ],
    ids=["swallowed-by-library-code", "beside-slow-calls-in-threads"],
)
def test_a_ctrl_c_a_sub_call_meets_stops_the_block_and_reaches_the_caller(code: str) -> None:
    """Library code that swallows everything cannot keep the interrupt from the caller,
    and the block's other sub-calls are cancelled, not waited for and paid."""
    events: list[Any] = []
    rlm = RLM(
        "scripted",
        {
            "respond": root_and_sub([repl(code)], _interrupting),
            "latency": lambda r: 30.0 if "slow" in (r.messages[-1].content or "") else 0.0,
        },
        environment="local",
        listeners=[events.append],
    )
    with pytest.raises(KeyboardInterrupt):
        rlm.completion("ctx")
    asked = {e.node_id: e.input_preview for e in events if isinstance(e, NodeStarted)}
    calls = [e for e in events if isinstance(e, NodeFinished) and e.kind == "llm_call"]
    slow = [e.status for e in calls if "slow" in asked[e.node_id]]
    # Those that had started (the block may stop before a thread sends its call) were
    # cancelled, none answered.
    assert all(status == "cancelled" for status in slow)
    assert all(e.status != "running" for e in events if isinstance(e, NodeFinished))


async def _async_listener(event: object) -> None:
    """What an asyncio user writes first: it would get a coroutine per event, never run."""


class _AsyncCallable:
    async def __call__(self, event: object) -> None: ...


@pytest.mark.parametrize(
    ("listener", "name"),
    [
        (_async_listener, "_async_listener"),
        (functools.partial(_async_listener), "partial"),
        (_AsyncCallable(), "_AsyncCallable"),
    ],
)
def test_an_async_listener_is_refused_when_configured(listener: Any, name: str) -> None:
    """It was accepted and silently received nothing ("coroutine was never awaited")."""
    plain: list[Any] = []
    wanted = (
        "a listener is called on the scheduler's thread and must be a plain function; "
        "use astream() for async consumers"
    )
    with pytest.raises(ConfigError, match=re.escape(wanted)) as raised:
        RLM("scripted", {"respond": lambda request: "x"}, listeners=[plain.append, listener])
    assert "\n" not in str(raised.value) and name in str(raised.value)
    with pytest.raises(ConfigError, match=re.escape(wanted)):
        Engine("scripted", {"respond": lambda request: "x"}, listeners=[listener])
    engine = Engine("scripted", {"respond": lambda request: "x"}, listeners=[plain.append])
    with pytest.raises(ConfigError, match=re.escape(wanted)):
        engine.new_run(listeners=[listener])
