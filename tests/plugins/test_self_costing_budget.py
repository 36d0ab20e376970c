"""``max_budget`` with a provider that reports its own cost (``reports_cost = True``) and
a model the price table does not know: before the first cost is known nothing can be
estimated, so calls do not go out concurrently until one has settled; the overshoot stays
within one call. Counted where the money is: at the server (real HTTP)."""

from __future__ import annotations

from typing import Any

import pytest

from rlm_graph import Engine, Workflow
from rlm_graph.testing import FakeOpenAIServer
from rlm_graph_openai import OpenAIProvider
from tests.support.http import openai_kwargs

PER_CALL = 0.001


class BillingServer(FakeOpenAIServer):
    """Bills every request it answers (``usage.cost``, as OpenRouter reports it)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(lambda body: "summary", cost_per_call=PER_CALL, latency=0.02, **kwargs)

    @property
    def billed(self) -> float:
        return sum(payload["usage"]["cost"] for status, payload in self.responses if status == 200)


class SelfCosting(OpenAIProvider):
    reports_cost = True  # its ChatResponse.cost is the price: no table entry needed


@pytest.mark.parametrize("workers", [16, 64])
async def test_a_self_costing_provider_overspends_by_at_most_one_call(workers: int) -> None:
    budget = 0.005
    with BillingServer() as server:
        provider = SelfCosting(**openai_kwargs(server, model_name="house-model", max_concurrent=16))
        async with Engine(provider, max_budget=budget) as engine:
            wf = Workflow()
            for i in range(workers):
                wf.llm(f"summarize chunk {i}")
            result = await engine.arun(wf)
    assert result.stop_reason == "max_budget"
    # Before: 16 requests billed $0.016 while the engine recorded $0.008.
    assert server.billed <= budget + PER_CALL + 1e-12
    assert len(server.requests) <= round(budget / PER_CALL) + 1
    spent = sum(r.cost or 0.0 for r in result.graph.records())
    assert spent == pytest.approx(server.billed)  # every billed call was counted
