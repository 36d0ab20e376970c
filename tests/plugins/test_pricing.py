"""``max_budget`` only with prices: a model that has none is refused at configuration,
dated and ``vendor/`` ids are priced as their base model, over real HTTP."""

from __future__ import annotations

import pytest

from rlm_graph import RLM, Engine, Workflow
from rlm_graph.errors import ConfigError
from rlm_graph.testing import FakeOpenAIServer
from tests.support.http import KEY, openai_kwargs


@pytest.mark.parametrize(
    ("backend", "model"),
    [
        ("openai", "gpt-5-mini-2025-08-07"),
        ("openrouter", "openai/gpt-5-mini"),
        ("openai", "gpt-5-mini"),
    ],
)
async def test_dated_and_vendor_ids_are_priced_as_their_base_model(
    backend: str, model: str
) -> None:
    with FakeOpenAIServer(lambda body: "x" * 400) as server:
        kwargs = openai_kwargs(server, model_name=model)
        async with Engine(backend, kwargs, max_budget=1.0) as engine:
            wf = Workflow()
            ref = wf.llm("y" * 4000)
            result = await engine.arun(wf)
    record = result.graph[ref.id]
    assert record.usage is not None
    assert (record.usage.input_tokens, record.usage.output_tokens) == (1000, 100)
    # gpt-5-mini: $0.25 in, $2.00 out per million tokens.
    assert record.cost == pytest.approx((1000 * 0.25 + 100 * 2.00) / 1e6)


@pytest.mark.parametrize(
    ("backend", "model"),
    [
        ("vllm", "llama3"),
        ("ollama", "qwen2.5:7b"),
        ("openrouter", "mistralai/unlisted-model"),
        ("openai", "gpt-6-preview"),
    ],
)
def test_max_budget_with_an_unpriced_model_is_refused_naming_it_and_the_fix(
    backend: str, model: str
) -> None:
    kwargs = {"model_name": model, "base_url": "http://127.0.0.1:9/v1", "api_key": KEY}
    with pytest.raises(ConfigError) as info:
        RLM(backend, kwargs, max_budget=0.5)
    message = str(info.value)
    assert f"{model!r} (backend {backend!r})" in message
    assert "models={" in message and "input_usd_per_mtok" in message
    # Priced, it is accepted (0 for a free local model is a price).
    RLM(
        backend,
        kwargs,
        max_budget=0.5,
        models={model: {"input_usd_per_mtok": 0, "output_usd_per_mtok": 0}},
    )
    # Without max_budget nothing needs a price.
    RLM(backend, kwargs)


def test_every_model_calls_could_use_needs_a_price() -> None:
    main = {"model_name": "gpt-5-mini", "base_url": "http://127.0.0.1:9/v1", "api_key": KEY}
    with pytest.raises(ConfigError, match=r"'local-sub' \(backend 'vllm'\)"):
        RLM(
            "openai",
            main,
            other_backends=["vllm"],
            other_backend_kwargs=[{"model_name": "local-sub"}],
            max_budget=1.0,
        )
    with pytest.raises(ConfigError, match=r"'gpt-9' \(backend 'openai'\)"):
        RLM("openai", main, allowed_models=["gpt-4o", "gpt-9"], max_budget=1.0)
    # Set per run, the budget is checked as well.
    engine = Engine("vllm", {"model_name": "llama3"})
    with pytest.raises(ConfigError, match="'llama3'"):
        engine.run(Workflow(), max_budget=1.0)


async def test_a_workflow_naming_an_unpriced_model_fails_that_node_before_any_request() -> None:
    with FakeOpenAIServer() as server:
        async with Engine(
            "openai", openai_kwargs(server, model_name="gpt-5-mini"), max_budget=1.0
        ) as engine:
            wf = Workflow()
            priced = wf.llm("a")
            unpriced = wf.llm("b", priced, model="homemade-model")
            result = await engine.arun(wf)
        models = [body["model"] for body in server.bodies]
    assert result[priced] == "echo: a"
    assert result.stop_reason == "fatal_error"  # a configuration error stops the workflow
    assert result.graph[unpriced.id].error_type == "ConfigError"
    assert "'homemade-model' has no price" in (result.graph[unpriced.id].error or "")
    assert models == ["gpt-5-mini"]


@pytest.mark.parametrize("backend", ["openai", "openrouter"])
@pytest.mark.parametrize("reported", [0.0, 0.01])
async def test_a_cost_a_server_reports_never_counts_below_the_table(
    backend: str, reported: float
) -> None:
    """A server's ``usage.cost`` overrode the price table: one that said $0 switched
    ``max_budget`` off (9 calls of a run that 2 should have stopped). The larger counts:
    the table's price, or what the server says it bills when that is more."""
    with FakeOpenAIServer(lambda body: "x" * 400, cost_per_call=reported) as server:
        kwargs = openai_kwargs(server, model_name="gpt-5-mini")
        async with Engine(backend, kwargs, max_budget=1.0) as engine:
            wf = Workflow()
            ref = wf.llm("y" * 4000)
            result = await engine.arun(wf)
    table = (1000 * 0.25 + 100 * 2.00) / 1e6  # gpt-5-mini's price of the call
    assert result.graph[ref.id].cost == pytest.approx(max(table, reported))


@pytest.mark.parametrize(
    ("given", "per_million"),
    [
        ({"output_usd_per_mtok": 1.0}, (0.25, 1.0)),  # the plugin's input price stays
        ({"input_usd_per_mtok": 0.2}, (0.2, 2.0)),  # and its output price
    ],
)
async def test_one_price_given_for_a_known_model_keeps_the_others(
    given: dict[str, float], per_million: tuple[float, float]
) -> None:
    with FakeOpenAIServer(lambda body: "x" * 400) as server:
        kwargs = openai_kwargs(server, model_name="gpt-5-mini")
        async with Engine("openai", kwargs, models={"gpt-5-mini": given}) as engine:
            wf = Workflow()
            ref = wf.llm("y" * 4000)
            result = await engine.arun(wf)
    plain, output = per_million
    assert result.graph[ref.id].cost == pytest.approx((1000 * plain + 100 * output) / 1e6)
