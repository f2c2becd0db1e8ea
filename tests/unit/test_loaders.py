"""Loaders: fixtures for every layout, typed errors naming file and line, real data counts."""

import json
import re

import pytest
from tests.conftest import require_dataset

from rag.corpus.hygiene import dedupe, leakage_report, load_split, stratified_split
from rag.corpus.loaders import (
    HOTPOTQA_FILE,
    MTRAG_FILE,
    load_beir,
    load_dataset,
    load_hotpotqa,
    load_jsonl_corpus,
    load_mtrag,
)
from rag.errors import ConfigError, DataError
from rag.types import Example, Passage

HP = {"id": "q1", "question": "Who wrote X?", "answer": "Ann Lee", "type": "bridge",
      "level": "easy",
      "supporting_facts": {"title": ["X", "Ann Lee"], "sent_id": [0, 1]},
      "context": {"title": ["X", "Ann Lee", "Other"],
                  "sentences": [["X is a book.", " It was written by Ann Lee."],
                                ["Ann Lee is a writer.", " She was born in 1950."],
                                ["Other text."]]}}


def test_hotpotqa_both_layouts_agree(tmp_path):
    hf = tmp_path / "hp.jsonl"
    hf.write_text(json.dumps(HP) + "\n" + json.dumps({**HP, "id": "q2"}) + "\n")
    official = tmp_path / "hp.json"
    official.write_text(json.dumps([{
        "_id": "q1", "question": HP["question"], "answer": HP["answer"], "type": "bridge",
        "level": "easy", "supporting_facts": [["X", 0], ["Ann Lee", 1]],
        "context": [[t, s] for t, s in zip(HP["context"]["title"], HP["context"]["sentences"],
                                           strict=True)]}]))
    a, b = load_hotpotqa(hf), load_hotpotqa(official)
    assert len(a.corpus) == 3  # pooled: q2 repeats q1's paragraphs, deduplicated
    assert a.corpus.ids == b.corpus.ids
    e = b.examples[0]
    assert e.gold_titles == ("X", "Ann Lee") and e.category == "bridge"
    assert e.supporting_facts == (("X", 0), ("Ann Lee", 1))
    assert [a.corpus[p].title for p in e.gold_passage_ids] == ["X", "Ann Lee"]
    assert a.corpus[e.gold_passage_ids[1]].text == "Ann Lee is a writer. She was born in 1950."
    assert len(load_hotpotqa(hf, pooled=False).corpus) == 6


def test_malformed_line_and_missing_file_name_the_place(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": "a", "text": "ok"}\n{"id": "b", "text": \n')
    with pytest.raises(DataError) as exc:
        load_jsonl_corpus(p)
    assert exc.value.line == 2 and str(p) in str(exc.value)
    p.write_text('{"id": "a", "text": "ok"}\n{"id": "b"}\n')
    with pytest.raises(DataError, match=r":2: missing field 'text'"):
        load_jsonl_corpus(p)
    with pytest.raises(DataError, match="does not exist"):
        load_dataset(str(tmp_path / "nope.jsonl"))


def test_beir_fixture(tmp_path):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text(
        '{"_id": "d1", "title": "T1", "text": "alpha"}\n{"_id": "d2", "title": "", '
        '"text": "beta"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "1", "text": "alpha?"}\n'
                                            '{"_id": "2", "text": "unjudged"}\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\td1\t2\n1\td2\t0\n")
    ds = load_beir(tmp_path)
    assert len(ds.examples) == 1  # only judged queries
    assert ds.examples[0].qrels == {"d1": 2, "d2": 0}
    assert ds.examples[0].gold_passage_ids == ("d1",)


def _beir_folder(d, corpus: bytes, queries: bytes, qrels: bytes):
    (d / "qrels").mkdir(parents=True, exist_ok=True)
    (d / "corpus.jsonl").write_bytes(corpus)
    (d / "queries.jsonl").write_bytes(queries)
    (d / "qrels" / "test.tsv").write_bytes(qrels)
    return d


CORPUS = b'{"_id": "d1", "text": "alpha"}\n{"_id": "d2", "text": "beta"}\n'
QUERIES = b'{"_id": "q1", "text": "alpha?"}\n{"_id": "q2", "text": "beta?"}\n'
QRELS = b"query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n"


@pytest.mark.parametrize("where, corpus, queries, qrels, line, message", [
    # bytes that are not UTF-8, in each file: the file and the line, not a UnicodeDecodeError
    ("corpus.jsonl", CORPUS + b'{"_id": "d3", "text": "caf\xe9"}\n', QUERIES, QRELS, 3,
     "not UTF-8: byte 0xe9"),
    ("queries.jsonl", CORPUS, QUERIES + b'{"_id": "q3", "text": "\xff"}\n', QRELS, 3,
     "not UTF-8"),
    ("test.tsv", CORPUS, QUERIES, QRELS + b"q2\td\xff\t1\n", 4, "not UTF-8"),
    # wrong types and nulls: named, not an AttributeError later or the string "None"
    ("corpus.jsonl", b'{"_id": "d1", "title": ["T"], "text": "a"}\n', QUERIES, QRELS, 1,
     "field 'title': expected a string"),
    ("corpus.jsonl", b'{"_id": "d1", "text": 42}\n', QUERIES, QRELS, 1,
     "field 'text': expected a string"),
    ("corpus.jsonl", b'{"_id": null, "text": "a"}\n', QUERIES, QRELS, 1,
     "field '_id': expected a non-empty string or an integer id, got None"),
    ("queries.jsonl", CORPUS, b'{"_id": "q1", "text": 123}\n', QRELS, 1,
     "field 'text': expected a non-empty string"),
    ("queries.jsonl", CORPUS, QUERIES + b'{"_id": "q3", "text": "  "}\n', QRELS, 3,
     "field 'text': expected a non-empty string"),
    # duplicates: an error where a later record silently replaced an earlier one
    ("corpus.jsonl", CORPUS + b'{"_id": "d1", "text": "again"}\n', QUERIES, QRELS, 3,
     "duplicate passage id 'd1' (first at line 1)"),
    ("queries.jsonl", CORPUS, QUERIES + b'{"_id": "q1", "text": "Another?"}\n', QRELS, 3,
     "duplicate query id 'q1' (first at line 1)"),
    ("test.tsv", CORPUS, QUERIES, QRELS + b"q1\td1\t0\n", 4,
     "duplicate judgement (query-id, corpus-id)"),
    ("test.tsv", CORPUS, QUERIES, QRELS + b"q9\td1\t1\n", 4, "query 'q9' is not in"),
    ("corpus.jsonl", b"", QUERIES, QRELS, None, "no passages"),
])
def test_beir_input_errors_name_file_line_and_field(tmp_path, where, corpus, queries, qrels,
                                                     line, message):
    d = _beir_folder(tmp_path / "b", corpus, queries, qrels)
    with pytest.raises(DataError) as exc:
        load_beir(d)
    assert message in str(exc.value) and where in str(exc.value), exc.value
    assert exc.value.line == line


@pytest.mark.parametrize("change, line, message", [
    ({"answer": None}, 2, "field 'answer': expected a string, got None"),
    ({"question": 5}, 2, "field 'question': expected a non-empty string"),
    ({"question": ""}, 2, "field 'question': expected a non-empty string"),
    ({"type": ["x"]}, 2, "field 'type': expected a string"),
    ({"id": "q1"}, 2, "duplicate question id 'q1' (first at line 1)"),
])
def test_hotpotqa_records_are_checked_field_by_field(tmp_path, change, line, message):
    p = tmp_path / "hp.jsonl"
    p.write_text(json.dumps(HP) + "\n" + json.dumps({**HP, "id": "q2", **change}) + "\n")
    with pytest.raises(DataError) as exc:
        load_hotpotqa(p)
    assert message in str(exc.value) and exc.value.line == line, exc.value
    p.write_bytes(json.dumps(HP).encode() + b"\n" + json.dumps(HP).encode()[:-2] +
                  b'"\xe9"}\n')
    with pytest.raises(DataError, match="not UTF-8") as exc:
        load_hotpotqa(p)
    assert exc.value.line == 2
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(DataError, match="no records"):
        load_hotpotqa(tmp_path / "empty.json")


def test_jsonl_corpus_fields_ids_and_emptiness_are_checked(tmp_path):
    p = tmp_path / "c.jsonl"
    for text, message in [('{"id": null, "text": "x"}', "got None"),
                          ('{"id": "a", "text": 9}', "field 'text': expected a string"),
                          ('{"id": "a", "text": "x", "metadata": [1]}', "field 'metadata'"),
                          ('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}',
                           "duplicate passage id 'a'"),
                          ("", "no passages")]:
        p.write_text(text + "\n")
        with pytest.raises(DataError, match=re.escape(message)):
            load_jsonl_corpus(p)
    with pytest.raises(DataError, match="is a directory"):
        load_jsonl_corpus(tmp_path)


ALL_DATA = ("scifact/corpus.jsonl", HOTPOTQA_FILE, MTRAG_FILE)
"""The three built-in files: a data root holding only some of them skips, naming the one
missing, instead of failing."""


def test_real_datasets_counts_and_splits():
    root = [require_dataset(f) for f in ALL_DATA][0].parents[1]
    sf = load_beir(root / "scifact")
    assert (len(sf.corpus), len(sf.examples)) == (5183, 300)
    hp = load_dataset("hotpotqa")
    assert len(hp.examples) == 1100
    assert all(len(e.gold_passage_ids) == 2 for e in hp.examples)
    mt = load_mtrag(root / "mtrag/mtragun-human/generation_tasks/reference.jsonl")
    assert len(mt.examples) == 507 and all(e.history or e.question for e in mt.examples)
    for name, n_total in (("hotpotqa", 1100), ("mtrag", 507), ("scifact", 300 + 809)):
        m = load_split(name)
        m.check_disjoint()
        assert sum(len(v) for v in m.splits.values()) == n_total
    hp_split = load_split("hotpotqa")
    assert hp_split.source_sha256["hotpot_dev_distractor_1100.jsonl"].startswith("d1f67e9b")
    # stratified: the comparison share in test is within 2 points of the whole set's
    share = sum(e.category == "comparison" for e in hp.examples) / 1100
    test = set(hp_split.ids("test"))
    t_share = sum(e.category == "comparison" for e in hp.examples if e.id in test) / 300
    assert abs(share - t_share) < 0.02


def test_splits_are_reproducible_from_sources():
    for f in ALL_DATA:
        require_dataset(f)
    from scripts.make_splits import build_all

    for name, m in build_all().items():
        assert m.splits == load_split(name).splits, name


def test_stratified_split_and_bad_sizes():
    exs = [Example(id=f"e{i}", question="q", category="a" if i % 4 else "b") for i in range(100)]
    m = stratified_split(exs, {"train": 0.5, "test": 0.5}, seed=1, name="t")
    assert sum(e.category == "b" for e in exs if e.id in set(m.ids("test"))) == 12 or \
        sum(e.category == "b" for e in exs if e.id in set(m.ids("test"))) == 13
    assert m.splits == stratified_split(exs, {"train": 0.5, "test": 0.5}, 1, "t").splits
    assert m.splits != stratified_split(exs, {"train": 0.5, "test": 0.5}, 2, "t").splits
    with pytest.raises(ConfigError, match="sizes"):
        stratified_split(exs, {"train": 80, "test": 30}, 1, "t")
    with pytest.raises(ConfigError, match="split"):
        m.ids("valid")


def test_dedupe_and_leakage():
    ps = [Passage("1", "Paris is in France.", "Paris"), Passage("2", "paris is in  france",
                                                                "PARIS"),
          Passage("3", "Lyon is a city; Paris is larger.", "Lyon")]
    kept, dropped = dedupe(ps)
    assert [p.id for p in kept] == ["1", "3"] and dropped == [("2", "1")]
    ex = [Example(id="q", question="?", answers=("Paris",), gold_passage_ids=("1",)),
          Example(id="y", question="?", answers=("yes",))]
    rep = leakage_report(ex, kept)
    assert rep["checked"] == 1 and rep["in_gold"] == 1 and rep["in_non_gold"] == 1
    assert rep["examples"][0]["passages"] == ["3"]


def test_a_leading_byte_order_mark_is_read_the_same_in_every_format(tmp_path):
    """Editors on Windows write a UTF-8 BOM; each format reads such a file as the file
    without it (JSON once failed on it, and the TSV header compared as '\\ufeffquery-id')."""
    from rag.settings_base import YamlSource
    from rl.promotion.evidence import read_located

    bom = "\ufeff".encode()
    plain = load_beir(_beir_folder(tmp_path / "a", CORPUS, QUERIES, QRELS))
    marked = load_beir(_beir_folder(tmp_path / "b", bom + CORPUS, bom + QUERIES, bom + QRELS))
    assert marked.corpus.ids == plain.corpus.ids
    assert [(e.id, e.gold_passage_ids) for e in marked.examples] == \
        [(e.id, e.gold_passage_ids) for e in plain.examples]
    hf = tmp_path / "hp.jsonl"
    hf.write_bytes(bom + json.dumps(HP).encode() + b"\n")
    official = tmp_path / "hp.json"
    official.write_bytes(bom + json.dumps([{**HP, "context": [[t, s] for t, s in zip(
        HP["context"]["title"], HP["context"]["sentences"], strict=True)],
        "supporting_facts": [["X", 0], ["Ann Lee", 1]]}]).encode())
    assert load_hotpotqa(hf).corpus.ids == load_hotpotqa(official).corpus.ids
    y = tmp_path / "c.yaml"
    y.write_bytes(bom + b"rag:\n  k: 3\n")
    assert YamlSource.read(y).data == {"rag": {"k": 3}}
    ev = tmp_path / "e.json"
    ev.write_bytes(bom + b'[{"a": 1}, {"b": 2}]')
    assert read_located(ev) == [(f"{ev} record 1", {"a": 1}), (f"{ev} record 2", {"b": 2})]


def test_a_json_list_names_its_records_from_1(tmp_path):
    p = tmp_path / "hp.json"
    p.write_text(json.dumps([{**HP, "_id": "q1"}, 5]))
    with pytest.raises(DataError, match="record 2: expected a JSON object"):
        load_hotpotqa(p)


def test_a_duplicate_in_a_json_list_names_both_records_and_spaces_are_a_blank_line(tmp_path):
    p = tmp_path / "hp.json"
    rec = {**HP, "_id": "q1", "context": [[t, s] for t, s in zip(
        HP["context"]["title"], HP["context"]["sentences"], strict=True)],
        "supporting_facts": [["X", 0]]}
    rec.pop("id")
    p.write_text(json.dumps([rec, {**rec, "_id": "q2"}, rec]))
    with pytest.raises(DataError, match=r"record 3: duplicate question id 'q1' \(first at "
                                        r"record 1\)"):
        load_hotpotqa(p)
    # a qrels line of spaces is a blank line, as in the JSONL files (it was "expected
    # query-id, corpus-id, score")
    d = _beir_folder(tmp_path / "b", CORPUS, QUERIES, QRELS.replace(b"\nq2", b"\n   \nq2"))
    assert [e.id for e in load_beir(d).examples] == ["q1", "q2"]
