"""The converters, on small files in each benchmark's published columns (tests/eval/data),
through ``rlm-graph eval convert``; what they write is a valid items file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlm_graph.cli import main
from rlm_graph.eval import scan_items, score

DATA = Path(__file__).parent / "data"


def _convert(tmp_path: Path, *args: str) -> dict[str, dict[str, Any]]:
    out = tmp_path / "items.jsonl"
    assert main(["eval", "convert", *args, "-o", str(out)]) == 0
    scan_items(out)  # a valid items file, every line
    return {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}


def test_oolong_rows_become_numeric_and_label_items_scored_as_its_harness_scores(
    tmp_path: Path,
) -> None:
    items = _convert(
        tmp_path,
        "--from",
        "oolong",
        str(DATA / "oolong-synth.jsonl"),
        "--filter",
        "dataset=trec_coarse",
    )
    assert sorted(items) == ["101", "102", "103", "104"]  # the agnews row is filtered out
    count, label, comparison, date = (items[i] for i in ("101", "102", "103", "104"))
    assert (count["answer"], count["answer_type"]) == (1, "numeric")
    assert (label["answer"], label["answer_type"]) == ("location", "label")
    assert comparison["answer"] == "more common than"
    assert date["answer"] == "Mar 05, 2023"
    assert count["context"].startswith("The following lines") and "User: 12" in count["context"]
    assert count["meta"]["context_window_id"] == 7 and count["meta"]["dataset"] == "trec_coarse"
    assert score("numeric", count["answer"], "Answer: 2") == 0.75
    assert score("label", comparison["answer"], "Answer: more common") == 1.0
    assert score("label", date["answer"], "Date: Mar 05, 2023") == 1.0


def test_browsecomp_plus_contexts_hold_every_evidence_and_gold_document_filled_from_the_corpus(
    tmp_path: Path,
) -> None:
    source = str(DATA / "browsecomp-plus-decrypted.jsonl")
    items = _convert(
        tmp_path,
        "--from",
        "browsecomp-plus",
        source,
        "--corpus",
        str(DATA / "browsecomp-plus-corpus.jsonl"),
        "--docs",
        "6",
        "--seed",
        "3",
    )
    first = items["769"]
    assert first["answer"] == "Port Alder" and first["answer_type"] == "exact"
    assert (
        first["question"].startswith("Which harbour town")
        and "exact answer only" in first["question"]
    )
    assert len(first["context"]) == 6
    assert (
        sum("Mira Quell" in doc for doc in first["context"]) == 2
    )  # evidence 1 and 2 (1 is gold too, once)
    assert any(doc.startswith("Document 3 (https://example.org/3)") for doc in first["context"])
    assert first["meta"]["gold_docs"] == ["1"] and first["meta"]["evidence_docs"] == ["1", "2"]
    again = _convert(
        tmp_path,
        "--from",
        "browsecomp-plus",
        source,
        "--corpus",
        str(DATA / "browsecomp-plus-corpus.jsonl"),
        "--docs",
        "6",
        "--seed",
        "3",
    )
    assert again == items  # the seed fixes the draw and the order
    alone = _convert(tmp_path, "--from", "browsecomp-plus", source)
    assert len(alone["812"]["context"]) == 2  # without a corpus: the query's own documents


def test_longbench_v2_keeps_codeqa_with_its_zero_shot_question(tmp_path: Path) -> None:
    items = _convert(tmp_path, "--from", "longbench-v2", str(DATA / "longbench-v2.json"))
    assert sorted(items) == ["66f36490821e116aacb2cc22", "671b3e31bb02136c067d5320"]
    item = items["66f36490821e116aacb2cc22"]
    assert (item["answer"], item["answer_type"]) == ("B", "choice")
    assert (
        "(B) A syntax tree" in item["question"]
        and "The correct answer is (insert answer here)" in item["question"]
    )
    assert item["context"].startswith("# 66f36490821e116aacb2cc22.py")
    assert item["meta"]["sub_domain"] == "Code repo QA"
    every = _convert(
        tmp_path, "--from", "longbench-v2", str(DATA / "longbench-v2.json"), "--all-domains"
    )
    assert len(every) == 3


def test_a_file_in_other_columns_or_still_obfuscated_is_refused_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"prompt": "q", "completion": "a"}) + "\n")
    assert main(["eval", "convert", "--from", "oolong", str(wrong)]) == 2
    assert (
        "no column 'id', 'question', 'answer', 'answer_type', 'context_window_text'"
        in capsys.readouterr().err
    )
    hidden = tmp_path / "obfuscated.jsonl"
    hidden.write_text(
        json.dumps(
            {
                "query_id": "1",
                "query": "QmFzZTY0IGVuY3J5cHRlZCBnYXJiYWdlIHRoYXQgaXMgbG9uZw==",
                "answer": "eA==",
            }
        )
        + "\n"
    )
    assert main(["eval", "convert", "--from", "browsecomp-plus", str(hidden)]) == 2
    assert "decrypt_dataset.py" in capsys.readouterr().err
    assert (
        main(
            ["eval", "convert", "--from", "oolong", str(DATA / "oolong-synth.jsonl"), "--docs", "5"]
        )
        == 2
    )
    assert "--corpus and --docs go with --from browsecomp-plus" in capsys.readouterr().err
    assert not (tmp_path / "items.jsonl").exists()


def test_convert_writes_to_stdout_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "convert", "--from", "longbench-v2", str(DATA / "longbench-v2.json")]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2 and "2 items from longbench-v2.json" in captured.err


def test_a_filter_on_a_column_the_file_lacks_is_refused_and_no_match_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "items.jsonl"
    source = str(DATA / "oolong-synth.jsonl")
    code = main(
        ["eval", "convert", "--from", "oolong", source, "--filter", "datset=x", "-o", str(out)]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--filter 'datset': the file has no such column; its columns: " in err
    assert "dataset" in err
    assert not out.exists() and not (tmp_path / "items.jsonl.partial").exists()
    code = main(
        [
            "eval",
            "convert",
            "--from",
            "oolong",
            source,
            "--filter",
            "dataset=TREC_COARSE",
            "-o",
            str(out),
        ]
    )
    assert code == 0
    assert "0 items" in (err := capsys.readouterr().err) and "no row matched --filter" in err


def test_converting_a_download_onto_itself_is_refused_and_the_download_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mine.jsonl"
    mine.write_bytes((DATA / "oolong-synth.jsonl").read_bytes())
    (tmp_path / "link.jsonl").symlink_to(mine)
    for output in (mine, tmp_path / "." / "mine.jsonl", tmp_path / "link.jsonl"):
        code = main(["eval", "convert", "--from", "oolong", str(mine), "-o", str(output)])
        assert code == 2
        assert "is a file convert reads: the download would be replaced" in capsys.readouterr().err
    assert mine.read_bytes() == (DATA / "oolong-synth.jsonl").read_bytes()


@pytest.mark.parametrize(
    ("name", "data", "says"),
    [
        ("deep.jsonl", b"[" * 200_000 + b"\n", "deep.jsonl:1: not JSON (nested past"),
        ("latin.jsonl", '{"id": "caf\xe9"}\n'.encode("latin-1"), "latin.jsonl:1: not UTF-8 text"),
        ("deep.json", b"[" * 200_000, "deep.json is not JSON (nested past"),
    ],
)
def test_a_download_that_is_not_json_it_can_read_is_named_and_leaves_no_partial_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, data: bytes, says: str
) -> None:
    """A line nested past Python's stack and a file that is not UTF-8 ended convert with a
    traceback and left ``ITEMS.jsonl.partial`` behind."""
    (tmp_path / name).write_bytes(data)
    out = tmp_path / "items.jsonl"
    assert main(["eval", "convert", "--from", "oolong", str(tmp_path / name), "-o", str(out)]) == 2
    assert says in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_download_with_a_byte_order_mark_converts(tmp_path: Path) -> None:
    source = tmp_path / "bom.jsonl"
    source.write_bytes(b"\xef\xbb\xbf" + (DATA / "oolong-synth.jsonl").read_bytes())
    plain = tmp_path / "plain"
    plain.mkdir()
    assert _convert(tmp_path, "--from", "oolong", str(source)) == _convert(
        plain, "--from", "oolong", str(DATA / "oolong-synth.jsonl")
    )


def _oolong_row(answer: str) -> str:
    row = json.loads((DATA / "oolong-synth.jsonl").read_text().splitlines()[0])
    return json.dumps({**row, "answer": answer}) + "\n"


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ("[datetime.date(2023, 13, 5)]", "is no date (month must be in 1..12)"),
        ("[datetime.date(" + "9" * 23 + ", 1, 5)]", "is no date"),
        ("[" + "1+" * 200_000 + "1]", "is not the list literal OOLONG writes"),
    ],
)
def test_an_oolong_answer_no_harness_writes_is_refused_naming_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], answer: str, says: str
) -> None:
    """A month 13, a year past what a date holds and a sum nested past Python's stack ended
    convert with a traceback."""
    download = tmp_path / "oolong.jsonl"
    download.write_text(_oolong_row(answer))
    out = str(tmp_path / "items.jsonl")
    assert main(["eval", "convert", "--from", "oolong", str(download), "-o", out]) == 2
    assert says in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["oolong.jsonl"]


def test_a_corpus_line_nested_past_pythons_stack_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b'{"docid": "c1", "text": "t", "url": "u"}\n' + b"[" * 200_000 + b"\n")
    queries = DATA / "browsecomp-plus-decrypted.jsonl"
    args = ["eval", "convert", "--from", "browsecomp-plus", str(queries), "--corpus", str(corpus)]
    assert main([*args, "-o", str(tmp_path / "items.jsonl")]) == 2
    assert "corpus.jsonl:2: a corpus row has a 'docid'" in capsys.readouterr().err
