"""Scoring, against values computed by hand from the papers' definitions."""

from __future__ import annotations

import math

import pytest

from rlm_graph.eval.scoring import (
    MAX_REPLY_CHARS,
    answer_part,
    choice_letter,
    normalize,
    number_in,
    parse_pairs,
    score,
)


def test_exact_match_after_normalisation() -> None:
    assert normalize("  The Eiffel-Tower! ") == "eiffeltower"
    assert normalize("Café") == "cafe"
    assert score("exact", "4821337", "4821337.") == 1.0
    assert score("exact", "Ms. Ortiz", "ms ortiz") == 1.0
    assert score("exact", "the answer", "An answer") == 1.0  # articles go
    assert score("exact", "4821337", "The number is 4821337.") == 0.0  # exact, not containment
    assert score("exact", "4821337", None) == 0.0


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("Answer: 12", 12, 1.0),
        ("12", 15, 0.75**3),  # 0.421875
        ("**Answer:** 9", 12, 0.75**3),
        ("There are 1,204 of them", 1200, 0.75**4),  # 0.31640625
        ("Answer: 12.5", 12, 0.75**0.5),
        ("no idea", 12, 0.0),
    ],
)
def test_numeric_is_three_quarters_to_the_power_of_the_error(
    prediction: str, gold: int, expected: float
) -> None:
    assert math.isclose(score("numeric", gold, prediction), expected)


def test_numeric_reads_the_answer_part_first() -> None:
    assert answer_part("I counted lines 1 to 40.\nAnswer: 7") == "7"
    assert number_in("I counted lines 1 to 40.\nAnswer: 7") == 7.0
    assert number_in("7 of the 40") == 40.0  # no colon: the last number of the reply


def test_label_matches_the_answer_part_and_oolongs_comparison_phrases() -> None:
    assert score("label", "location", "Label: Location") == 1.0
    assert score("label", "numeric value", "The most common is:\n**numeric value**") == 1.0
    assert score("label", "human being", "Label: entity") == 0.0
    assert score("label", "more common than", "Answer: more common") == 1.0
    assert score("label", "less common than", "Answer: more common") == 0.0


def test_pairs_f1_of_a_known_overlap() -> None:
    gold = [[1, 2], [1, 3], [2, 3]]
    # One of two predicted pairs is right: precision 1/2, recall 1/3, F1 = 2PR/(P+R) = 0.4.
    assert math.isclose(score("pairs", gold, "[[2, 1], [2, 4]]"), 0.4)
    assert score("pairs", gold, "[[3, 2], [1, 2], [1, 3]]") == 1.0  # order inside a pair is free
    assert math.isclose(score("pairs", gold, "Pairs: (1, 2) and (1, 3)"), 0.8)  # P=1, R=2/3
    assert score("pairs", gold, "[]") == 0.0
    assert score("pairs", [], "[]") == 1.0
    assert parse_pairs('here: [["10001", 10002]]') == {("10001", "10002")}
    # A reply nested past the stack is read as text (its written-out pairs), not a crash.
    assert parse_pairs("[" * 100_000 + "(1, 2)" + "]" * 100_000) == {("1", "2")}


def test_pairs_as_python_prints_them_and_beside_other_brackets_score_as_pairs() -> None:
    """``FINAL(pairs)`` hands over ``str()`` of the list: user ids found with
    ``re.findall`` are strings, printed in single quotes, which is not JSON; the quotes
    stayed in the written-out pairs and a right answer scored 0. A bracket elsewhere in
    the reply hid a JSON list the same way."""
    gold = [["10001", "10002"], ["10003", "10004"]]
    assert score("pairs", gold, str([("10001", "10002"), ("10003", "10004")])) == 1.0
    assert score("pairs", gold, str([["10002", "10001"], ["10003", "10004"]])) == 1.0
    assert score("pairs", gold, "Pairs: [[10001, 10002], [10003, 10004]] (see [note])") == 1.0
    assert score("pairs", gold, "[note] then [[10001, 10002]]") == 2 / 3
    assert score("pairs", gold, "('10001', '10002') and (\"10003\", \"10004\")") == 1.0
    assert score("pairs", gold, "[['10001', '10002'], ['10003', '99']]") == 0.5


def test_choice_reads_longbench_v2s_form_first() -> None:
    assert choice_letter("The correct answer is (B)") == "B"
    assert choice_letter("**The correct answer is C**") == "C"
    assert choice_letter("Answer: D") == "D"
    assert choice_letter("(a)") == "A"
    assert choice_letter("the answer is a function of x") is None  # 'a' is not a choice here
    assert score("choice", "B", "The correct answer is (B).") == 1.0
    assert score("choice", "B", "The correct answer is (A).") == 0.0


def test_every_score_is_in_zero_one_and_an_unknown_type_is_refused() -> None:
    for answer_type, gold in (
        ("exact", "x"),
        ("label", "x"),
        ("numeric", 3),
        ("pairs", [[1, 2]]),
        ("choice", "A"),
    ):
        for prediction in (None, "", "x", "Answer: -1000000", "[[1,2]]", "(A)"):
            assert 0.0 <= score(answer_type, gold, prediction) <= 1.0
    with pytest.raises(ValueError, match="unknown answer_type"):
        score("fuzzy", "x", "x")


def test_normalising_keeps_what_makes_a_number_and_drops_unicode_punctuation() -> None:
    """``35`` matched a gold ``3.5`` and ``5`` a gold ``-5`` (their points and signs went
    with the punctuation), while a curly apostrophe kept ``O’Brien`` from ``O'Brien``."""
    assert score("exact", "3.5", "35") == 0.0 and score("exact", "3.5", "3.5.") == 1.0
    assert score("exact", "-5", "5") == 0.0 and score("exact", "-5", "-5") == 1.0
    assert score("exact", "1204", "1,204") == 1.0
    assert score("exact", "O'Brien", "O’Brien") == 1.0
    assert score("exact", "Paris", "“Paris”") == 1.0
    assert score("exact", "well-known", "wellknown") == 1.0  # as SQuAD's normalisation


def test_choice_reads_answer_is_colon_letter() -> None:
    assert choice_letter("The answer is: B") == "B"
    assert choice_letter("the answer is a function of x") is None


def test_a_hostile_reply_is_scored_in_one_pass_and_past_the_cap_is_not_read() -> None:
    """A reply is the model's, untrusted: ``"(" + 4,000 spaces`` took the written-out
    pairs' pattern half a minute (it backtracked cubically over the spaces) and ``answer
    is`` before spaces took the choice patterns quadratic time; the rerun's rescoring paid
    it again. Each is a few milliseconds now; a sized input the old patterns would take
    hours over."""
    gold = [["a", "b"]]
    assert score("pairs", gold, "(" + " " * 20_000) == 0.0
    assert score("pairs", gold, "(" + " " * 20_000 + "a, b)") == 1.0
    assert score("choice", "B", "answer is" + " " * 200_000 + "B") == 1.0
    # The written-out names are stripped of spaces and quotes; an empty one is no pair.
    assert parse_pairs("( 'a' ,  \"b\" ) and ( , c) and ('', d)") == {("a", "b")}
    # Only the first MAX_REPLY_CHARS characters of a reply are read.
    assert score("pairs", gold, "[['a', 'b']]" + " " * MAX_REPLY_CHARS) == 1.0
    assert score("pairs", gold, " " * MAX_REPLY_CHARS + "[['a', 'b']]") == 0.0


def test_a_reply_naming_every_comparison_matches_only_the_first_it_names() -> None:
    """A reply hedging with all three phrases scored 1 against every comparison gold: any
    phrase of the reply found in the gold counted. One phrase is read, the first named."""
    hedge = "Answer: more common, less common, or same frequency"
    assert score("label", "more common than", hedge) == 1.0
    assert score("label", "less common than", hedge) == 0.0
    assert score("label", "same frequency as", hedge) == 0.0
    assert score("label", "less common than", "Answer: less common (not more common)") == 1.0
    assert score("label", "more common than", "Answer: less common (not more common)") == 0.0


def test_a_gold_answer_of_articles_or_punctuation_alone_is_matched_as_text() -> None:
    """``The`` or ``—`` normalises to nothing, and such a gold answer matched no reply:
    it is compared as stripped, lower-cased text."""
    assert score("exact", "The", " the ") == 1.0
    assert score("exact", "—", "—") == 1.0
    assert score("label", "The", "Label: **the**") == 1.0
    assert score("exact", "The", "A") == 0.0
    assert score("exact", "—", "") == 0.0 and score("label", "—", "Label: -") == 0.0


def test_a_range_keeps_its_two_numbers_and_a_minus_sign_is_a_sign() -> None:
    """``3-5`` normalised to ``35`` (the dash went as punctuation), matching a gold
    ``35``; and a minus sign (U+2212) was not read as a sign, so ``−5`` missed ``-5``."""
    assert normalize("3-5") == normalize("3–5") == "3 5"
    assert score("exact", "35", "3-5") == 0.0 and score("exact", "3–5", "3-5") == 1.0
    assert score("exact", "-5", "\u22125") == 1.0 and score("exact", "5", "\u22125") == 0.0
    assert score("exact", "well-known", "wellknown") == 1.0  # a dash between words still goes
    assert number_in("Answer: \u22125") == -5.0 and number_in("Answer: 3-5") == 5.0
    assert score("numeric", -5, "Answer: \u22125") == 1.0
