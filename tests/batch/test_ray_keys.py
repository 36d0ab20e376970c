"""The variables the ray executor sends its workers: those the batch's providers take
their keys (and base URLs) from, whatever their names, and nothing else; set in a worker
only while a completion's engine is built. A real local Ray cluster (its workers started
before the variables were set in the driver, as a joined cluster's nodes have their own
environment), a fake OpenAI server over real HTTP that wants the key."""

from __future__ import annotations

import re
from typing import Any

import pytest

from rlm_graph import run_batch
from tests.support.batch import KEY, BatchServer, is_root_turn, items, rlm_kwargs

pytestmark = pytest.mark.ray

# Names of this test only: a developer's own OPENAI_API_KEY may be in every process.
GATEWAY, SUB_GATEWAY = "RLM_TEST_GATEWAY_TOKEN", "RLM_TEST_SUB_GATEWAY_TOKEN"
OWN_VARIABLE = "RLM_TEST_GATEWAY_API_KEY"  # *_API_KEY, as a backend's own variable is named
OTHER_SERVICE = "RLM_TEST_STRIPE_API_KEY"
WATCHED = (GATEWAY, SUB_GATEWAY, OWN_VARIABLE, OTHER_SERVICE)
UNRELATED = "sk-live-not-for-this-batch-123456"

# The model's code: one sub-call, the process it runs in, and which of the watched
# variables it can see (the local environment runs it in the worker process).
ENV_CODE = f"""
import os
seen = sorted(name for name in os.environ if name in {WATCHED!r})
answer["content"] = "|".join([llm_query("hello"), f"pid={{os.getpid()}}", *seen])
answer["ready"] = True
"""


class EnvServer(BatchServer):
    """Root turns get `ENV_CODE`."""

    def _respond(self, body: dict[str, Any]) -> Any:
        if is_root_turn(body):
            super()._respond(body)  # counted
            return f"```repl\n{ENV_CODE}\n```"
        return super()._respond(body)


def _keyless(server: BatchServer, **backend_kwargs: Any) -> dict[str, Any]:
    """The batch's keywords with no key of their own (``backend_kwargs`` says where)."""
    kwargs = {**rlm_kwargs(server), "environment": "local"}
    del kwargs["backend_kwargs"]["api_key"]
    kwargs["backend_kwargs"].update(backend_kwargs)
    return kwargs


def _seen(answer: str | None) -> tuple[int, list[str]]:
    """The worker's pid and the watched variables its model code saw."""
    assert answer is not None
    sub, pid, *seen = answer.split("|")
    assert sub == "sub:hello"
    return int(pid.removeprefix("pid=")), seen


def test_the_variables_the_configuration_names_reach_the_workers_and_no_other(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --api-key-env GATEWAY_TOKEN for the root model, another for the sub-calls' model.
    monkeypatch.setenv(GATEWAY, KEY)
    monkeypatch.setenv(SUB_GATEWAY, KEY)
    monkeypatch.setenv(OTHER_SERVICE, UNRELATED)  # another service's, not the batch's
    with EnvServer(api_key=KEY) as server:
        kwargs = _keyless(server, api_key_env=GATEWAY)
        sub = {**kwargs["backend_kwargs"], "api_key_env": SUB_GATEWAY}
        kwargs.update(other_backends=["openai"], other_backend_kwargs=[sub])
        results = list(run_batch(items(2), kwargs, concurrency=2, executor="ray"))
        sent = {r.headers.get("authorization") for r in server.requests}
    for result in results:
        assert result.ok, result.error
        # Both keys were there when the engine was built; the model's code, after,
        # sees neither, nor the unrelated key, which never left the driver.
        assert _seen(result.answer)[1] == []
    assert sent == {f"Bearer {KEY}"}


def test_a_worker_keeps_no_key_after_the_completion_that_needed_it(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OWN_VARIABLE, KEY)
    monkeypatch.setenv(OTHER_SERVICE, UNRELATED)
    with EnvServer(api_key=KEY) as server:
        first = list(
            run_batch(
                items(2),
                _keyless(server, api_key_env=OWN_VARIABLE),
                concurrency=2,
                executor="ray",
            )
        )
        # The next batch of the driver, on the same workers, forwarding nothing.
        later = list(
            run_batch(
                items(2),
                {**rlm_kwargs(server), "environment": "local"},
                concurrency=2,
                executor="ray",
                executor_kwargs={"forward_keys": False},
            )
        )
    assert all(r.ok for r in first + later), [r.error for r in first + later]
    first_seen = [_seen(r.answer) for r in first]
    later_seen = [_seen(r.answer) for r in later]
    assert {pid for pid, _ in later_seen} <= {pid for pid, _ in first_seen}  # same workers
    assert [seen for _, seen in first_seen + later_seen] == [[]] * 4


def test_a_base_url_from_the_environment_goes_with_its_key(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$OPENAI_API_KEY is sent to $OPENAI_BASE_URL: the worker gets both, so it calls the
    server the driver chose (with the key alone, the official host)."""
    with EnvServer(api_key=KEY) as server:
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        kwargs = {**_keyless(server), "backend_kwargs": {"model_name": "gpt-test", "timeout": 10}}
        (result,) = run_batch(items(1), kwargs, concurrency=2, executor="ray")
        assert result.ok, result.error
        assert len(server.requests) == 2  # the root turn and its sub-call, both here
    assert re.fullmatch(r"sub:hello\|pid=\d+", result.answer or "")


def test_the_variables_sent_are_exactly_those_the_providers_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the driver sends, asserted where it is decided (the Ray tests above see only
    what model code can read once a completion's engine is built). A provider that does
    not say where its key comes from (a plugin's, without ``key_variables``) may read any
    ``*_API_KEY`` variable: those are sent for it, as before providers said."""
    from rlm_graph_ray.executor import forwarded_variables
    from rlm_graph_scripted import ScriptedProvider

    for name in WATCHED:
        monkeypatch.setenv(name, KEY)
    with BatchServer() as server:
        kwargs = _keyless(server, api_key_env=GATEWAY)
        kwargs["other_backends"] = ["openai"]
        kwargs["other_backend_kwargs"] = [{**kwargs["backend_kwargs"], "api_key_env": SUB_GATEWAY}]
        kwargs["other_backend_kwargs"][0]["model_name"] = "sub-model"
        assert forwarded_variables(kwargs) == {GATEWAY: KEY, SUB_GATEWAY: KEY}
        unsaid = {**kwargs, "other_backends": [ScriptedProvider(model_name="sub-model")]}
        del unsaid["other_backend_kwargs"]
        sent = forwarded_variables(unsaid)
    assert sent.keys() >= {GATEWAY, OWN_VARIABLE, OTHER_SERVICE} and SUB_GATEWAY not in sent
