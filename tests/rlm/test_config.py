"""Configuration details of the facade: compaction objects, the model table."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from rlm_graph import RLM, ModelInfo, hookimpl
from rlm_graph.contracts import Message
from rlm_graph.errors import ConfigError
from rlm_graph.hooks import PluginHost


class KeepAll:
    name = "keep-all"

    def should_compact(self, messages: Sequence[Message], **kwargs: object) -> bool:
        return False

    async def compact(self, messages: Sequence[Message], ctx: object) -> list[Message]:
        return list(messages)


def test_compaction_takes_a_strategy_object() -> None:
    strategy = KeepAll()
    engine = RLM("scripted", {"responses": []}, compaction=strategy)
    assert engine.settings.compaction is strategy
    with pytest.raises(ConfigError, match="has no should_compact"):
        RLM("scripted", {"responses": []}, compaction=object())


def test_compaction_kwargs_reach_the_strategy_and_bad_ones_are_named() -> None:
    with pytest.raises(ConfigError, match="rejected compaction_kwargs"):
        RLM("scripted", {"responses": []}, compaction="truncate", compaction_kwargs={"nope": 1})


def test_model_tables_from_two_plugins_merge_field_by_field() -> None:
    class Windows:
        @hookimpl
        def rlm_register_models(self) -> dict[str, ModelInfo]:
            return {"m": ModelInfo(context_window=1000)}

    class Prices:
        @hookimpl
        def rlm_register_models(self) -> dict[str, ModelInfo]:
            return {"m": ModelInfo(input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)}

    info = PluginHost([Windows(), Prices()], entry_points=False).models["m"]
    assert info == ModelInfo(context_window=1000, input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)
