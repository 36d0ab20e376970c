"""What the first message tells the root model of its context."""

from __future__ import annotations

from rlm_graph import RLM
from tests.support.scripts import repl, scripted


def _first_message(context: object) -> str:
    rlm = RLM("scripted", {"responses": [repl("FINAL('ok')")]})
    rlm.completion(context)
    return scripted(rlm).requests[0].messages[1].content


def test_a_list_of_chat_messages_is_described_by_its_characters() -> None:
    """Two messages of 50,000 and 30,000 characters were described as "sizes: 2, 2; 4
    in all" (the dicts' keys counted): the model took the context for a tiny one."""
    said = _first_message(
        [{"role": "user", "content": "x" * 50_000}, {"role": "assistant", "content": "y" * 30_000}]
    )
    assert "a list of 2 items (sizes in characters: 50,000, 30,000; 80,000 in all)" in said


def test_nested_items_and_dict_values_are_sized_in_characters() -> None:
    assert "(sizes in characters: 15, 3; 18 in all)" in _first_message([["x"] * 3, "abc"])
    said = _first_message({"doc": "z" * 1_000, "ids": [1, 2]})
    assert "characters of each value: 'doc': 1,000, 'ids': 6; 1,006 in all" in said


def test_many_items_only_json_can_size_are_measured_in_part() -> None:
    """Each of a million small dicts was encoded to JSON on the engine's loop (seconds,
    every other completion of a batch held up): past the first 200 such items, the rest
    count at their mean, and the total says so."""
    said = _first_message([{"n": 1}] * 1_000)
    assert "(sizes in characters: 8, 8," in said and "about 8,000 in all" in said
