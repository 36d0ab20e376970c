"""When a hedged call's duplicate may go (rlm_graph.hedging.policy), without a loop."""

from __future__ import annotations

import pytest

from rlm_graph import ConfigError
from rlm_graph.hedging import HedgeBudget, HedgePolicy


def _budget(**policy: object) -> HedgeBudget:
    hedging = HedgePolicy.of(dict(policy) or True)
    assert hedging is not None
    return HedgeBudget(hedging)


def test_a_batch_s_first_answers_do_not_make_the_rest_look_slow() -> None:
    hedges = _budget()
    for _ in range(64):
        hedges.began("m")
    # The 8 fastest of 64 have answered: the rest are slower than them, but nothing says
    # they are slower than 90% of the batch yet.
    for seconds in [0.1 * i for i in range(1, 9)]:
        hedges.answered("m", seconds)
        hedges.ended("m")
    assert hedges.delay("m") is None
    # 58 of 64 answered: the 6 still in flight are the slowest tenth.
    for seconds in [1.0 + 0.01 * i for i in range(50)]:
        hedges.answered("m", seconds)
        hedges.ended("m")
    assert hedges.delay("m") == pytest.approx(1.49)


def test_with_history_the_delay_is_the_quantile_of_the_model_s_latencies() -> None:
    hedges = _budget(quantile=0.9)
    for seconds in range(1, 101):
        hedges.began("m")
        hedges.answered("m", float(seconds))
        hedges.ended("m")
    assert hedges.delay("m") == 90.0
    assert hedges.delay("other") is None  # latencies are per model


def test_no_delay_before_min_samples() -> None:
    hedges = _budget(min_samples=5)
    for seconds in (1.0, 2.0, 3.0, 4.0):
        hedges.answered("m", seconds)
    assert hedges.delay("m") is None
    hedges.answered("m", 5.0)
    assert hedges.delay("m") == 5.0


def test_waiters_hear_when_the_delay_becomes_known() -> None:
    hedges = _budget(min_samples=2)
    heard: list[str] = []
    hedges.began("m")
    hedges.began("m")
    hedges.when_known("m", lambda: heard.append("known"))
    hedges.answered("m", 1.0)
    hedges.ended("m")
    assert heard == []
    hedges.answered("m", 2.0)
    hedges.ended("m")
    assert heard == ["known"]


def test_duplicates_stay_within_max_extra_of_the_calls() -> None:
    hedges = _budget(max_extra=0.1)
    for _ in range(30):
        hedges.called()
    sent = 0
    while hedges.may_send():
        hedges.sent()
        sent += 1
    assert sent == 3


@pytest.mark.parametrize(
    "value", [{"quantile": 0}, {"max_extra": 2}, {"min_samples": 0}, {"min_samples": 4097}, 1.5]
)
def test_bad_settings_are_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError):
        HedgePolicy.of(value)  # type: ignore[arg-type]


def test_a_bad_hedge_given_to_rlm_says_the_key_and_the_ranges_in_plain_words() -> None:
    from rlm_graph import RLM

    with pytest.raises(ConfigError) as caught:
        RLM("scripted", {"respond": lambda r: "x"}, hedge={"quantile": 1.5})
    said = str(caught.value)
    assert said.startswith("bad hedge setting: quantile:") and "the keys are quantile" in said
    assert "Value error" not in said and "bad limit" not in said
