"""Items files: every bad line named before anything runs; contexts in files; the draw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlm_graph.errors import ConfigError
from rlm_graph.eval import read_items, sample_items, scan_items


def test_every_bad_line_is_reported_with_its_number(tmp_path: Path) -> None:
    path = tmp_path / "items.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps(
                    {
                        "id": "a",
                        "question": "q",
                        "answer": "x",
                        "answer_type": "exact",
                        "context": "c",
                    }
                ),
                "not json",
                json.dumps(
                    {
                        "id": "b",
                        "question": "q",
                        "answer": "many",
                        "answer_type": "numeric",
                        "context": "c",
                    }
                ),
                json.dumps(
                    {
                        "id": "c",
                        "question": "q",
                        "answer": [[1]],
                        "answer_type": "pairs",
                        "context": "c",
                    }
                ),
                json.dumps(
                    {
                        "id": "d",
                        "question": "q",
                        "answer": "AB",
                        "answer_type": "choice",
                        "context": "c",
                    }
                ),
                json.dumps(
                    {
                        "id": "a",
                        "question": "q",
                        "answer": "x",
                        "answer_type": "exact",
                        "context": "c",
                    }
                ),
                json.dumps(
                    {
                        "id": "e",
                        "question": "q",
                        "answer": "x",
                        "answer_type": "fuzzy",
                        "context": "c",
                    }
                ),
                json.dumps(
                    {
                        "id": "f",
                        "question": "q",
                        "answer": "x",
                        "answer_type": "exact",
                        "context_path": "nope.txt",
                    }
                ),
                json.dumps(
                    {
                        "id": "g",
                        "question": "q",
                        "answer": "x",
                        "answer_type": "exact",
                        "context": "c",
                        "extra": 1,
                    }
                ),
            ]
        )
        + "\n"
    )
    with pytest.raises(ConfigError) as info:
        scan_items(path)
    message = str(info.value)
    for expected in (
        "items.jsonl:2: not JSON",
        "items.jsonl:3: a numeric answer must be a number",
        "items.jsonl:4: a pairs answer must be a list of two-element lists",
        "items.jsonl:5: a choice answer is one letter",
        "items.jsonl:6: id 'a' already used on line 1",
        "items.jsonl:7: 'answer_type' must be one of exact, numeric, label, pairs, choice",
        "items.jsonl:8: context_path",
        "items.jsonl:9: unknown key(s) 'extra'",
    ):
        assert expected in message


def test_contexts_in_text_and_json_files_are_read_when_used(tmp_path: Path) -> None:
    (tmp_path / "doc.txt").write_text("plain text")
    (tmp_path / "docs.json").write_text(json.dumps(["first document", "second document"]))
    path = tmp_path / "items.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(
                {
                    "id": i,
                    "question": "q",
                    "answer": "x",
                    "answer_type": "exact",
                    "context_path": name,
                }
            )
            for i, name in ((1, "doc.txt"), (2, "docs.json"))
        )
        + "\n"
    )
    assert scan_items(path) == ["1", "2"]
    text, docs = read_items(path)
    assert text.load_context() == "plain text" and text.text_file == str(tmp_path / "doc.txt")
    assert docs.load_context() == ["first document", "second document"] and docs.text_file is None


def test_a_json_context_nested_past_pythons_stack_is_a_config_error_naming_the_item(
    tmp_path: Path,
) -> None:
    (tmp_path / "deep.json").write_text("[" * 200_000)
    row = {"id": "q", "question": "q", "answer": "x", "answer_type": "exact"}
    (tmp_path / "items.jsonl").write_text(json.dumps({**row, "context_path": "deep.json"}) + "\n")
    (item,) = read_items(tmp_path / "items.jsonl")
    with pytest.raises(ConfigError, match="item 'q': context_path .* is not JSON \\(nested past"):
        item.load_context()


def test_the_draw_is_seeded_and_keeps_the_file_order() -> None:
    ids = [f"q{i}" for i in range(50)]
    drawn = sample_items(ids, 10, seed=4)
    assert drawn == sample_items(ids, 10, seed=4) and drawn != sample_items(ids, 10, seed=5)
    assert drawn == sorted(drawn, key=ids.index) and len(drawn) == 10
    assert sample_items(ids, None, seed=4) == ids == sample_items(ids, 80, seed=4)


def test_an_items_file_cannot_name_a_context_out_of_its_folder(tmp_path: Path) -> None:
    """A downloaded items file naming ``/proc/self/environ`` (the API key) or a file
    beside its folder sent it to the model as the context."""
    folder = tmp_path / "download"
    (folder / "docs").mkdir(parents=True)
    (folder / "docs" / "ok.txt").write_text("the context")
    (tmp_path / "secret.txt").write_text("not for the model")
    (folder / "docs" / "link.txt").symlink_to(tmp_path / "secret.txt")
    lines = [
        {"id": i, "question": "q", "answer": "x", "answer_type": "exact", "context_path": name}
        for i, name in enumerate(
            ["docs/ok.txt", "/proc/self/environ", "../secret.txt", "docs/link.txt"]
        )
    ]
    path = folder / "items.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(ConfigError) as info:
        scan_items(path)
    message = str(info.value)
    for number, name in ((2, "/proc/self/environ"), (3, "../secret.txt"), (4, "docs/link.txt")):
        assert (
            f"items.jsonl:{number}: context_path {name!r} leads out of the items file's folder"
            in message
        )
    assert "items.jsonl:1" not in message
    path.write_text(json.dumps(lines[0]) + "\n")
    (item,) = read_items(path)
    assert item.load_context() == "the context"


def test_a_numeric_gold_answer_is_finite(tmp_path: Path) -> None:
    """A gold NaN or infinity passed the check, and its item then scored 0 whatever the
    model answered."""
    path = tmp_path / "items.jsonl"
    lines = [
        {"id": i, "question": "q", "answer": gold, "answer_type": "numeric", "context": "c"}
        for i, gold in enumerate(["nan", "inf", "-Infinity", 12])
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(ConfigError) as info:
        scan_items(path)
    for number, gold in ((1, "nan"), (2, "inf"), (3, "-Infinity")):
        assert f"items.jsonl:{number}: a numeric answer must be finite, not {gold!r}" in str(
            info.value
        )
    assert "items.jsonl:4" not in str(info.value)


def test_a_line_nested_past_the_stack_and_an_id_with_half_a_character_are_bad_lines(
    tmp_path: Path,
) -> None:
    path = tmp_path / "items.jsonl"
    good = {"id": "ok", "question": "q", "answer": "x", "answer_type": "exact", "context": "c"}
    path.write_text(
        "[" * 200_000
        + "\n"
        + json.dumps({**good, "id": "a\ud83d"})
        + "\n"
        + json.dumps(good)
        + "\n"
    )
    with pytest.raises(ConfigError) as info:
        scan_items(path)
    assert "items.jsonl:1: nested more than 200 arrays and objects" in str(info.value)
    assert "items.jsonl:2: 'id' 'a\\ud83d' holds half a character" in str(info.value)
