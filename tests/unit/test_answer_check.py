"""The answer-type contract (rag.generation.answer_check) and the extractive reader answering the
question asked: no timestamp titles, no off-type spans, yes/no decided by the evidence."""

import pytest

from rag.generation.answer_check import (
    answer_type,
    check_answer,
    expected_type,
    fits,
    metadata_span,
)
from rag.generation.extractive import ExtractiveReader
from rag.generation.prompts import INSUFFICIENT
from rag.metrics import aggregate, metric_counts
from rag.types import Context


@pytest.mark.parametrize(("q", "want"), [
    ("What did Gina design for her store?", "entity"),
    ("Who directed the film?", "person"),
    ("When did Gina open her store?", "date"),
    ("In which year was it founded?", "date"),
    ("How many members does the band have?", "number"),
    ("Where was Ada Quill born?", "place"),
    ("Were Scott Derrickson and Ed Wood of the same nationality?", "yesno"),
    ("Which came first, Arthur's Magazine or First for Women?", "choice"),
    ("Was Pennsylvania State University or UCSF founded first?", "choice"),
    ("Is the ball red or blue?", "yesno"),
    ("What school was she attending when she was signed?", "entity"),
    ("Gina was born when?", "date"),
    ("What is the population of the birth city of Daniela Scalia?", "number"),
])
def test_expected_type(q, want):
    assert expected_type(q) == want


@pytest.mark.parametrize(("a", "want"), [
    ("2:15 pm on 21 June, 2023", "time"),
    ("21 June, 2023", "date"),
    ("June 2023", "date"),
    ("1931", "date"),
    ("2023-06-21", "date"),
    ("1,200 people", "number"),
    ("three", "number"),
    ("five months", "number"),
    ("one of the best", "text"),
    ("One Direction", "text"),
    ("yes", "yesno"),
    (INSUFFICIENT, "abstain"),
    ("I don't know", "abstain"),
    ("a new logo", "text"),
    ("Ada Quill", "text"),
])
def test_answer_type(a, want):
    assert answer_type(a) == want


def test_fits_contract():
    assert fits("date", "date") and fits("date", "number") and fits("number", "number")
    assert not fits("entity", "time") and not fits("person", "date")
    assert not fits("entity", "number") and fits("entity", "text")
    assert not fits("yesno", "text") and not fits("entity", "abstain")
    with pytest.raises(ValueError, match="expected"):
        fits("colour", "text")
    with pytest.raises(ValueError, match="kind"):
        fits("entity", "colour")


SESSION = [Context("d1", "2:15 pm on 21 June, 2023",
                   "Gina: I designed a new logo for my store last week. Jon: That sounds great."),
           Context("d2", "8:00 am on 3 May, 2023",
                   "Jon: I opened a dance studio downtown. Gina: Congratulations!")]


def test_metadata_span_and_check():
    titles, texts = [c.title for c in SESSION], [c.text for c in SESSION]
    assert metadata_span("2:15 pm on 21 June, 2023", titles, texts)
    assert not metadata_span("a new logo", titles, texts)
    # a Wikipedia-style disambiguated title the text never says is a title, its name is not
    wiki = (["Blue Hawaii (drink)"], ["Blue Hawaii is a tropical drink made with rum."])
    assert metadata_span("Blue Hawaii (drink)", *wiki)
    assert not metadata_span("Blue Hawaii", *wiki)
    bad = check_answer("What did Gina design for her store?", "2:15 pm on 21 June, 2023",
                       titles, texts)
    assert not bad.ok and bad.reason == "metadata"
    assert check_answer("When did Gina design a logo?", "21 June, 2023", titles, texts).ok
    off = check_answer("Who designed the logo?", "1931")
    assert not off.ok and off.reason == "off_type"
    assert check_answer("What did Gina design?", INSUFFICIENT).ok


def test_reader_never_answers_a_timestamp_title_to_a_what_question():
    g = ExtractiveReader().generate("What did Gina design for her store?", SESSION,
                                    "cite_concise")
    assert answer_type(g.text) == "text", g.text
    assert "logo" in g.text.lower() or "store" not in g.text.lower()
    assert not metadata_span(g.text, [c.title for c in SESSION], [c.text for c in SESSION])


def test_reader_skips_off_type_spans_for_who_questions():
    ctx = [Context("a", "Brask Works", "In 1950 Tom Ferr founded Brask Works in Stenmouth.")]
    g = ExtractiveReader().generate("Who founded Brask Works?", ctx, "cite_concise")
    assert g.text == "Tom Ferr"


YESNO = [Context("a", "Ballota", "Ballota is a genus of flowering plants in the mint family."),
         Context("b", "Myosotis", "Myosotis is a genus of flowering plants in the borage "
                                  "family."),
         Context("c", "Tiger Please", "Tiger Please were an indie rock band from Cardiff, "
                                      "Wales."),
         Context("d", "Black Rebel Motorcycle Club", "Black Rebel Motorcycle Club is an "
                                                     "American rock band from San Francisco."),
         Context("e", "The Kooks", "The Kooks are an English indie rock band from Brighton, "
                                   "England.")]


@pytest.mark.parametrize(("q", "want"), [
    ("Are Ballota and Myosotis both genera of flowering plants?", "yes"),
    ("Are Ballota and Myosotis both evergreen trees?", "no"),
    ("Are Tiger Please and Black Rebel Motorcycle Club from the same country?", "no"),
    ("Are Tiger Please and The Kooks both indie rock bands?", "yes"),
    ("Are Black Rebel Motorcycle Club and The Kooks both indie rock bands?", "no"),
])
def test_reader_decides_yes_no_from_the_evidence(q, want):
    assert ExtractiveReader().generate(q, YESNO, "cite_concise").text == want


def test_metric_counts_state_the_n_of_each_mean():
    rows = [{"f1": 1.0, "support": 1.0}, {"f1": 0.0}, {"f1": 0.5, "support": 0.0}]
    assert aggregate(rows) == {"f1": 0.5, "support": 0.5}
    assert metric_counts(rows) == {"f1": 3, "support": 2}


@pytest.mark.parametrize(("q", "want"), [
    ("Which came first, Arthur's Magazine or First for Women?",
     ["Arthur's Magazine", "First for Women"]),
    ("Which battle, the Battle of Cold Harbor, or the Second Battle of Bull Run, was fought "
     "first?", ["the Battle of Cold Harbor", "the Second Battle of Bull Run"]),
    ("Which musician or band is from further north, Matthew Good or Modern Baseball?",
     ["Matthew Good", "Modern Baseball"]),
    ("Was Pennsylvania State University or UCSF founded first?",
     ["Pennsylvania State University", "UCSF"]),
    ("Who was born first David Draiman or Terry Kath?", ["David Draiman", "Terry Kath"]),
    ("Who directed the film?", []),
])
def test_either_or_options(q, want):
    from rag.generation.extractive import _options

    assert _options(q) == want
