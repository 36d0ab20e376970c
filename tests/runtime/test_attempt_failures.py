"""An HTTP attempt's deadline and failures (`rlm_graph._http.answers.failures`): its own
deadline is a timeout the provider retries; a cancellation from outside (a run's limit,
Ctrl-C) passes through as a cancellation, never as a timeout; transport errors become
the errors and retries they call for, and anything else is left as it is."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from rlm_graph._http.answers import AttemptFailed, failures
from rlm_graph._http.transport import RequestNotSent
from rlm_graph.errors import BadResponse, ProviderError, ProviderTimeout


class _Provider:
    name = "openai"
    model = "m"
    base_url = "http://127.0.0.1:9/v1"
    key_rule = ""
    url = "http://127.0.0.1:9/v1/chat/completions"

    def _server_message(self, data: object) -> str:
        return ""

    def _quote(self, text: str, limit: int = 300) -> str:
        return text

    def _scrub(self, text: str) -> str:
        return text.replace("sk-secret-1234", "[REDACTED]")


async def test_its_own_deadline_is_a_timeout_to_retry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    with pytest.raises(AttemptFailed) as caught:
        with failures(_Provider(), 0.5, deadline=True):
            await trio.sleep(10)
    assert caught.value.reason == "timeout"
    assert isinstance(caught.value.error, ProviderTimeout)
    assert "within 0.5 s" in str(caught.value.error)
    assert trio.current_time() - start == pytest.approx(0.5)  # autojump clock


async def test_an_attempt_within_its_deadline_is_left_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with failures(_Provider(), 5.0, deadline=True):
        await trio.sleep(1)
    with failures(_Provider(), None, deadline=True):  # no timeout: no deadline
        await trio.sleep(100)


async def test_a_cancellation_from_outside_is_a_cancellation_not_a_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.move_on_after(1) as outer:
        with failures(_Provider(), 5.0, deadline=True):
            await trio.sleep(10)
    assert outer.cancelled_caught
    # The same when both deadlines fall at once: the outer one's cancellation wins,
    # as it would with trio.fail_after inside.
    with trio.move_on_after(1) as outer:
        with failures(_Provider(), 10.0, deadline=True):
            outer.cancel()
            await trio.sleep(10)
    assert outer.cancelled_caught


async def test_without_deadline_only_the_failures_are_read() -> None:
    with pytest.raises(AttemptFailed) as caught:
        with failures(_Provider(), 3.0):
            raise trio.TooSlowError  # a streamed attempt's stall, raised by its reader
    assert caught.value.reason == "timeout" and "within 3 s" in str(caught.value.error)


@pytest.mark.parametrize(
    ("raised", "reason", "kind", "said"),
    [
        (httpx.ReadTimeout("slow"), "timeout", ProviderTimeout, "no answer"),
        (httpx.ConnectError("refused sk-secret-1234"), "connection", ProviderError, "[REDACTED]"),
        (RequestNotSent("gone"), "not sent", ProviderError, "connection to"),
        (httpx.DecodingError("bad gzip"), "bad response", BadResponse, "does not decode"),
    ],
)
async def test_transport_failures_are_the_retries_they_call_for(
    raised: Exception, reason: str, kind: type[Exception], said: str
) -> None:
    with pytest.raises(AttemptFailed) as caught:
        with failures(_Provider(), 5.0, deadline=True):
            raise raised
    assert caught.value.reason == reason
    assert type(caught.value.error) is kind and caught.value.error.retryable
    assert said in str(caught.value.error) and "sk-secret-1234" not in str(caught.value.error)


async def test_a_request_that_cannot_be_written_is_not_retried() -> None:
    with pytest.raises(ProviderError, match="could not be written") as caught:
        with failures(_Provider(), 5.0, deadline=True):
            raise httpx.LocalProtocolError("bad header")
    assert not isinstance(caught.value, AttemptFailed) and not caught.value.retryable


async def test_anything_else_passes_as_it_is() -> None:
    with pytest.raises(KeyError):
        with failures(_Provider(), 5.0, deadline=True):
            raise KeyError("x")
    with pytest.raises(ExceptionGroup):
        with failures(_Provider(), 5.0, deadline=True):
            raise ExceptionGroup("two", [ValueError(1), ValueError(2)])


async def test_an_answer_that_came_as_the_deadline_passed_is_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The answer was read; the deadline passed before the attempt ended, with no
    # checkpoint between: nothing was cancelled, so nothing is a timeout.
    with failures(_Provider(), 1.0, deadline=True):
        await trio.sleep(0.5)
        autojump_clock.jump(2)
