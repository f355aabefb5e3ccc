"""The pieces under the reading table: the rule engine, English number words, punctuation runs."""

from __future__ import annotations

import re

import pytest

from cosyserve.frontend.text import numbers_en as en
from cosyserve.frontend.text.corrections import Piece, Reading, Rule, apply_rules, rewrite
from cosyserve.frontend.text.normalize import normalize_report, normalize_text
from cosyserve.frontend.text.official import official_chunk
from cosyserve.frontend.text.punctuation import collapse_runs
from cosyserve.frontend.text.readings_en import reads_as_year


def test_rules_run_in_order_and_never_touch_spoken_words() -> None:
    rules = (
        Rule("dash", re.compile(r"(\d)–(\d)"), rewrite(r"\1 to \2")),
        Rule("five", re.compile(r"\b5\b"), lambda m: Reading("FIVE", spoken=True)),
        Rule(
            "to", re.compile(r"to"), rewrite("TO")
        ),  # must not reach the spoken "FIVE" or earlier text twice
    )
    pieces, corrections = apply_rules("3–5 days to go", rules)
    assert pieces == [Piece("3 TO ", False), Piece("FIVE", True), Piece(" days TO go", False)]
    assert [(c.rule, c.written, c.reading, c.rewritten) for c in corrections] == [
        ("dash", "3–5", "3 to 5", True),
        ("five", "5", "FIVE", False),
        ("to", "to", "TO", True),
        ("to", "to", "TO", True),
    ]


def test_a_rule_that_declines_leaves_the_text() -> None:
    rule = Rule("never", re.compile(r"\d+"), lambda m: None)
    assert apply_rules("12 and 34", (rule,)) == ([Piece("12 and 34", False)], [])


@pytest.mark.parametrize("number", [3000, 3456, 9999, 12005, 100005, 120000, 999999, 1234567, 21000000])
def test_cardinals_are_worded_like_wetext(number: int) -> None:
    """Where wetext reads a plain number right, our words for it are the same words."""
    assert official_chunk(f"I have {number} apples.", "en") == f"I have {en.cardinal(number)} apples."


def test_english_number_words() -> None:
    assert en.cardinal(0) == "zero"
    assert en.cardinal(1005) == "one thousand and five"
    assert en.cardinal(10**15 - 1).startswith("nine hundred ninety nine trillion")
    with pytest.raises(ValueError):
        en.cardinal(10**15)
    assert en.decimal("0", "05") == "zero point zero five"
    assert en.grouped_digits(["555", "0123"]) == "five five five, zero one two three"
    assert [en.year(n) for n in (1990, 1905, 1900, 2005, 2010, 2000)] == [
        "nineteen ninety",
        "nineteen oh five",
        "nineteen hundred",
        "two thousand and five",
        "twenty ten",
        "two thousand",
    ]
    assert en.plural("nineteen ninety") == "nineteen nineties" and en.plural("twenty six") == "twenty sixes"


def test_which_counts_wetext_reads_as_years() -> None:
    assert [
        n
        for n in (999, 1000, 1001, 1100, 1234, 1999, 2000, 2005, 2010, 2150, 2345, 2900, 3000)
        if reads_as_year(n)
    ] == [
        1000,
        1001,
        1234,
        1999,
        2010,
        2150,
        2345,
    ]


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("In 2024 people moved.", "In twenty twenty four people moved."),  # after "in": a year
        ("By 2030 cars will fly.", "By twenty thirty cars will fly."),
        ("2024 was good.", "twenty twenty four was good."),  # no plural noun after it
        ("We counted 1999 votes.", "We counted one thousand nine hundred and ninety nine votes."),
    ],
)
def test_years_and_counts(text: str, spoken: str) -> None:
    assert normalize_text(text) == spoken


def test_punctuation_runs() -> None:
    assert collapse_runs("你好。。。！！再见？？", "zh") == ("你好。再见？", ["。。。！！", "？？"])
    assert collapse_runs("。。。开头", "zh") == ("。。。开头", [])  # nothing before it to end
    assert collapse_runs("等一下……好", "zh") == ("等一下……好", [])
    assert collapse_runs("Wait... what?!", "en") == ("Wait. what?", ["...", "?!"])
    assert collapse_runs("a,, b", "en") == ("a,, b", [])


def test_tags_stay_intact_around_corrections() -> None:
    report = normalize_report("It costs $12.50[laughter]!!! <strong>1,234</strong> people[breath].")
    assert report.spoken == (
        "It costs twelve dollars and fifty cents[laughter]! "
        "<strong>one thousand two hundred and thirty four</strong> people[breath]."
    )
    assert normalize_text("今天[breath]花了¥12.50。。。") == "今天[breath]花了十二点五元。"


def test_no_correction_no_change() -> None:
    """Ordinary prose goes through untouched: the same words as the official, no corrections."""
    for text in (
        "Dr. Smith arrived at 5 p.m. on Friday; everyone cheered.",
        "他说：“你好！”然后走了。",
        "In 1984, George Orwell wrote a book. It sold 2,000 copies in 3 days!",
    ):
        report = normalize_report(text, with_official=True)
        assert report.spoken == report.official and not report.corrections


def test_no_special_tag_holds_a_sentence_mark() -> None:
    """normalize collapses runs over the whole text, tags included: that is safe only while this holds."""
    from cosyserve.frontend.text.punctuation import SENTENCE_MARKS
    from cosyserve.frontend.text.tags import SPECIAL_TAGS

    marks = set(SENTENCE_MARKS["zh"] + SENTENCE_MARKS["en"])
    assert not [tag for tag in SPECIAL_TAGS if marks & set(tag)]


@pytest.mark.parametrize("number", [*range(1000, 10000, 37), 2001, 2008])
def test_counts_are_read_as_numbers(number: int) -> None:
    """Over 1000..9999: a count before a plural noun is a cardinal, or wetext's "fifteen hundred" and
    "two thousand five" wordings (kept: that is how people say them)."""
    spoken = normalize_text(f"I have {number} apples.")[len("I have ") : -len(" apples.")]
    kept = (number % 100 == 0 and spoken.endswith("hundred")) or 2001 <= number <= 2009
    assert spoken == en.cardinal(number) or (kept and spoken == official_chunk(str(number), "en"))
