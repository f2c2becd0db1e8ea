"""No silent zeros (issue 22): a user's own data is evaluated in full or refused with exit 2
naming the problem, or the problem is a counted warning; never a 0.0 with exit 0.

Every CLI case here stops before retrieval (no index build, no model weights); the end-to-end
run on a user's own file is tests/test_eval_own_data.py."""

import json

import pytest

from rag.corpus.hygiene import (
    default_split,
    gold_report,
    gold_warnings,
    load_split,
    manifest_for,
    resolve_split,
    stratified_split,
)
from rag.corpus.loaders import Dataset, load_beir, load_dataset, load_hotpotqa, path_name
from rag.corpus.store import Corpus
from rag.errors import ConfigError, CorpusMismatchError, DataError
from rag.indexset import IndexSet
from rag.types import Example, Passage
from serving.cli import main


def hotpot_record(i: int, *, fact_title: str | None = None) -> dict:
    """A HotpotQA (Hugging Face layout) record with two paragraphs; `fact_title` replaces the
    second supporting-fact title (one absent from the context)."""
    return {"id": f"new{i}", "question": f"Who wrote book {i}?", "answer": f"Author {i}",
            "type": "bridge" if i % 2 else "comparison", "level": "easy",
            "supporting_facts": {"title": [f"Book {i}", fact_title or f"Author {i}"],
                                 "sent_id": [0, 0]},
            "context": {"title": [f"Book {i}", f"Author {i}"],
                        "sentences": [[f"Book {i} was written by Author {i}."],
                                      [f"Author {i} is a writer."]]}}


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def write_beir(d, qrels: list[tuple[str, str, int]]) -> str:
    d.mkdir()
    write_jsonl(d / "corpus.jsonl", [{"_id": f"d{i}", "title": f"T{i}", "text": f"text {i}"}
                                     for i in range(4)])
    write_jsonl(d / "queries.jsonl", [{"_id": f"q{i}", "text": f"question {i}?"}
                                      for i in range(4)])
    (d / "qrels").mkdir()
    (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{c}\t{s}\n" for q, c, s in qrels))
    return str(d)


def dry_eval(dataset: str, *extra: str) -> int:
    return main(["eval", "--dataset", dataset, "--dry-run", *extra])


# ---- own files are evaluated in full --------------------------------------------------------
def test_own_hotpotqa_file_is_not_filtered_by_the_project_split(tmp_path):
    # a file of new ids named like the built-in dataset: before, 0 questions with exit 0
    path = write_jsonl(tmp_path / "hotpotqa.jsonl", [hotpot_record(i) for i in range(25)])
    ds = load_dataset(path)
    assert ds.name == "hotpotqa-local" and not ds.builtin
    assert manifest_for(ds) is None and default_split(ds) == "all"
    assert len(resolve_split(ds, default_split(ds))) == 25


def test_own_file_mixing_project_ids_is_evaluated_in_full(tmp_path):
    # before: a file sharing a few ids with the project's test split kept only those
    test_ids = load_split("hotpotqa").ids("test")[:3]
    recs = [hotpot_record(i) for i in range(20)]
    for r, qid in zip(recs, test_ids, strict=False):
        r["id"] = qid
    ds = load_dataset(write_jsonl(tmp_path / "mine.jsonl", recs))
    assert len(resolve_split(ds, default_split(ds))) == 20


def test_split_asked_of_own_file_is_exit_2_suggesting_all(tmp_path, capsys):
    path = write_jsonl(tmp_path / "mine.jsonl", [hotpot_record(i) for i in range(5)])
    assert dry_eval(path, "--split", "test") == 2
    err = capsys.readouterr().err
    assert "split manifest" in err and "--split all" in err and "'test'" in err


def test_beir_folder_split_error_suggests_all(tmp_path, capsys):
    d = write_beir(tmp_path / "mybeir", [("q0", "d0", 1), ("q1", "d1", 1)])
    ds = load_beir(d)
    assert ds.name == "mybeir" and default_split(ds) == "all"
    assert [e.id for e in resolve_split(ds, "all")] == ["q0", "q1"]
    assert dry_eval(d, "--split", "test") == 2
    assert "--split all" in capsys.readouterr().err


def test_path_names_never_shadow_builtin_names(tmp_path):
    assert path_name(tmp_path / "scifact.jsonl") == "scifact-local"
    assert path_name(tmp_path / "notes.jsonl") == "notes"
    rec = write_jsonl(tmp_path / "mtrag.json.jsonl", [hotpot_record(0)])
    assert load_hotpotqa(rec).name == "mtrag.json"


def test_manifest_applies_by_content_hash_only(tmp_path):
    m = load_split("hotpotqa")
    sha = next(iter(m.source_sha256.values()))
    ex = tuple(Example(id=i, question="q?", answers=("a",)) for i in m.ids("test")[:4])
    corpus = Corpus([Passage("p", "t")])
    same = Dataset("whatever", corpus, ex, {"/x/file.jsonl": sha})
    assert manifest_for(same).splits == m.splits
    assert len(resolve_split(same, "test")) == 4
    other = Dataset("hotpotqa", corpus, ex, {"/x/file.jsonl": "0" * 64}, builtin=True)
    assert manifest_for(other) is None
    with pytest.raises(DataError, match="hotpotqa.json.*--split all"):
        resolve_split(other, "test")


def test_split_selecting_nothing_names_split_and_counts():
    m = load_split("hotpotqa")
    sha = next(iter(m.source_sha256.values()))
    ds = Dataset("hp", Corpus([Passage("p", "t")]), (Example(id="not-in-any", question="q?"),),
                 {"f": sha})
    with pytest.raises(ConfigError, match=r"split 'test'.*300 ids.*none.*1 examples"):
        resolve_split(ds, "test")


def test_corpus_only_jsonl_passed_to_eval_is_exit_2(tmp_path, capsys):
    path = write_jsonl(tmp_path / "docs.jsonl", [{"id": "a", "text": "x"}, {"id": "b",
                                                                            "text": "y"}])
    assert main(["eval", "--dataset", path, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no questions" in err and "corpus-only" in err
    assert not (tmp_path / "o").exists()


# ---- gold outside the corpus ----------------------------------------------------------------
def test_labels_outside_corpus_warn_in_data_report_and_stop_eval(tmp_path, capsys):
    d = write_beir(tmp_path / "b", [("q0", "d0", 1), ("q1", "gone1", 1), ("q2", "gone2", 1),
                                    ("q3", "d3", 1), ("q3", "gone3", 2)])
    assert main(["data-report", "--dataset", d]) == 0
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    assert rep["gold"]["labels_outside_corpus"] == 3
    assert rep["gold"]["no_reachable_gold"] == 2 and rep["warnings"]
    assert "3 of 5 relevance labels" in cap.err
    # 2 of 4 unreachable is not more than half: a warning, and the run goes on (to the index
    # check, which refuses this index of another corpus)
    other = tmp_path / "other"
    IndexSet.create(Corpus([Passage("z", "zz")]), other, show_progress=False)
    assert main(["eval", "--dataset", d, "--index", str(other), "--out",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "warning:" in err and "index built from corpus" in err
    # no judgements at all: a counted warning, not a report of 0 examples that looks clean
    empty = write_beir(tmp_path / "b0", [])
    assert main(["data-report", "--dataset", empty]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["warnings"] and "no questions with gold" in cap.err
    d2 = write_beir(tmp_path / "b2", [("q0", "d0", 1), ("q1", "x", 1), ("q2", "y", 1)])
    assert dry_eval(d2) == 2
    err = capsys.readouterr().err
    assert "2 of 3 questions have no reachable gold" in err and "--allow-missing-gold" in err


def test_the_python_api_refuses_an_evaluation_of_nothing():
    """`rag.evaluate.evaluate` with no examples used to return n = 0 and token means of 0.0;
    the refusal comes before the pipeline is touched (None stands in for it here; real
    pipelines are evaluated throughout tests/)."""
    from rag.evaluate import evaluate

    with pytest.raises(ConfigError, match="nothing to evaluate") as exc:
        evaluate(None, [])
    assert exc.value.field == "examples"


def test_tune_and_tuner_eval_refuse_a_split_without_reachable_gold(tmp_path, monkeypatch,
                                                                     capsys):
    """The tuner's entry points check the gold of the splits they score before any search:
    a split whose questions mostly name documents the corpus lacks is refused (exit 2, the
    dataset, split and flag named), leaving no run directory behind. Accepting it on request:
    tests/test_tune_own_data.py."""
    monkeypatch.setattr("rl.common.data.cache_dir", lambda: tmp_path / "cache")
    d = write_beir(tmp_path / "b", [("q0", "x0", 1), ("q1", "x1", 1), ("q2", "x2", 1),
                                    ("q3", "d3", 1)])
    out = tmp_path / "run"
    assert main(["tune", "--dataset", d, "--no-mlflow", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "b (test split): 2 of 2 questions have no reachable gold" in err  # valid: 1 of 2
    assert "--allow-missing-gold" in err and not out.exists()  # a refused run leaves nothing
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # a directory the user made is kept, and its files
    assert main(["tune", "--dataset", d, "--no-mlflow", "--out", str(out)]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    capsys.readouterr()
    pol = tmp_path / "policy"
    assert main(["router", "train", "--dataset", d, "--out", str(pol)]) == 2
    assert "no reachable gold" in capsys.readouterr().err and not pol.exists()
    assert main(["tuner-eval", "--dataset", d, "--split", "test"]) == 2
    err = capsys.readouterr().err
    assert "b (test split): " in err and "allow_missing_gold" in err


def test_allow_missing_gold_lets_the_check_pass(tmp_path, capsys):
    d = write_beir(tmp_path / "b", [("q0", "d0", 1), ("q1", "x", 1), ("q2", "y", 1)])
    # past the gold check, the run reaches the index check (wrong corpus -> exit 2 there)
    other = tmp_path / "other"
    IndexSet.create(Corpus([Passage("z", "zz")]), other, show_progress=False)
    assert main(["eval", "--dataset", d, "--allow-missing-gold", "--index", str(other),
                 "--out", str(tmp_path / "o")]) == 2
    assert "index built from corpus" in capsys.readouterr().err


def test_supporting_fact_titles_missing_from_context_are_counted(tmp_path, capsys):
    recs = [hotpot_record(0), hotpot_record(1, fact_title="Nowhere")]
    ds = load_dataset(write_jsonl(tmp_path / "h.jsonl", recs))
    rep = gold_report(ds.examples, ds.corpus)
    assert rep["titles_missing"] == 1 and rep["examples_with_titles_missing"] == 1
    assert rep["no_reachable_gold"] == 0
    assert any("supporting-fact titles" in w for w in gold_warnings(rep))
    # every fact title missing: no reachable gold for most questions -> refused
    bad = [hotpot_record(i) for i in range(3)]
    for r in bad[:2]:
        r["supporting_facts"]["title"] = ["Nowhere", "Neither"]
    assert dry_eval(write_jsonl(tmp_path / "h2.jsonl", bad)) == 2
    assert "2 of 3 questions have no reachable gold" in capsys.readouterr().err


def test_supporting_facts_past_the_end_of_their_paragraph_are_counted(tmp_path):
    """A sentence index beyond its paragraph: the sentence-level metrics can never credit it
    (the CLI audit found it reported as a clean label)."""
    recs = [hotpot_record(0), hotpot_record(1)]
    recs[1]["supporting_facts"]["sent_id"] = [0, 99]
    ds = load_dataset(write_jsonl(tmp_path / "h.jsonl", recs))
    rep = gold_report(ds.examples, ds.corpus)
    assert rep["facts_outside_paragraph"] == 1 and rep["examples_with_facts_outside_paragraph"] == 1
    assert any("point past the end of their paragraph" in w for w in gold_warnings(rep))
    clean = gold_report(load_dataset(write_jsonl(tmp_path / "c.jsonl", recs[:1])).examples,
                        ds.corpus)
    assert clean["facts_outside_paragraph"] == 0 and not gold_warnings(clean)


# ---- an index of another corpus -------------------------------------------------------------
def test_index_of_another_corpus_is_refused_with_both_fingerprints(tmp_path, capsys):
    path = write_jsonl(tmp_path / "h.jsonl", [hotpot_record(i) for i in range(4)])
    other = write_jsonl(tmp_path / "o.jsonl", [hotpot_record(i) for i in range(4, 8)])
    ds, ods = load_dataset(path), load_dataset(other)
    idx = IndexSet.create(ods.corpus, tmp_path / "idx", show_progress=False)
    with pytest.raises(CorpusMismatchError) as exc:
        idx.check_corpus(ds.corpus, path)
    assert exc.value.index_fingerprint == ods.corpus.fingerprint()
    assert exc.value.dataset_fingerprint == ds.corpus.fingerprint()
    IndexSet.open(tmp_path / "idx").check_corpus(ods.corpus, other)  # same corpus: fine
    assert main(["eval", "--dataset", path, "--index", str(tmp_path / "idx"), "--out",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert ods.corpus.fingerprint() in err and ds.corpus.fingerprint() in err
    assert "ragpilot index --dataset" in err
    assert not (tmp_path / "o" / "summary.json").exists()


# ---- malformed records: exit 2 with file, line, field ---------------------------------------
@pytest.mark.parametrize(("mutate", "field"), [
    (lambda r: r["supporting_facts"].update(sent_id=[0]), "supporting_facts.sent_id"),
    (lambda r: r["supporting_facts"].update(sent_id=[0, "x"]), "supporting_facts.sent_id"),
    (lambda r: r["context"].update(sentences=[["a"]]), "context.sentences"),
    (lambda r: r.update(supporting_facts=[["Book 1", 0]]), "supporting_facts"),
    (lambda r: r.pop("question"), "question"),
])
def test_malformed_hotpotqa_record_is_exit_2_with_file_line_field(tmp_path, capsys, mutate,
                                                                   field):
    bad = hotpot_record(1)
    mutate(bad)
    path = write_jsonl(tmp_path / "h.jsonl", [hotpot_record(0), bad])
    assert dry_eval(path) == 2
    err = capsys.readouterr().err
    assert f"{path}:2:" in err and repr(field) in err


def test_malformed_official_layout_names_the_record(tmp_path):
    p = tmp_path / "h.json"
    p.write_text(json.dumps([{"_id": "a", "question": "q", "answer": "x",
                              "supporting_facts": [["T", 0, 9]], "context": [["T", ["s"]]]}]))
    with pytest.raises(DataError, match=r"record 1: field 'supporting_facts'"):
        load_hotpotqa(p)


def test_malformed_beir_and_mtrag_records(tmp_path):
    d = write_beir(tmp_path / "b", [("q0", "d0", 1)])
    (tmp_path / "b" / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                                        "q0\td0\thigh\n")
    with pytest.raises(DataError, match=r"test.tsv:2: score 'high'"):
        load_beir(d)
    from rag.corpus.loaders import load_mtrag

    m = write_jsonl(tmp_path / "m.jsonl", [{"task_id": "t", "input": [{"speaker": "user"}]}])
    with pytest.raises(DataError, match=r"m.jsonl:1: field 'input'"):
        load_mtrag(m)


def test_unknown_config_key_is_named_by_the_cli(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rag:\n  k: 3\n  maxx: 4\n")
    path = write_jsonl(tmp_path / "h.jsonl", [hotpot_record(0)])
    assert dry_eval(path, "--config", str(cfg)) == 2
    err = capsys.readouterr().err
    assert "maxx" in err and str(cfg) in err


# ---- stratified splits of any size ----------------------------------------------------------
@pytest.mark.parametrize(("n", "want"), [(1, (1, 0)), (2, (1, 1)), (3, (2, 1)), (7, (4, 3))])
def test_stratified_split_of_any_size(n, want):
    exs = [Example(id=f"e{i}", question="q", category="ab"[i % 2]) for i in range(n)]
    m = stratified_split(exs, {"valid": 0.5, "test": 0.5}, seed=13, name="t")
    assert (len(m.splits["valid"]), len(m.splits["test"])) == want
    assert sorted(m.splits["valid"] + m.splits["test"]) == sorted(e.id for e in exs)


def test_empty_derived_split_is_an_error_naming_counts():
    ds = Dataset("one", Corpus([Passage("p", "t")]), (Example(id="e0", question="q?"),))
    assert [e.id for e in resolve_split(ds, "valid", derive={"valid": 0.5, "test": 0.5})] \
        == ["e0"]
    with pytest.raises(ConfigError, match=r"split 'test'.*0 ids.*1 examples"):
        resolve_split(ds, "test", derive={"valid": 0.5, "test": 0.5})


def test_derived_splits_for_the_tuner_never_redraw_a_builtin_split():
    from rag.corpus.hygiene import DERIVED_SPLIT_SIZES, split_manifest

    world = load_dataset("synthetic")
    m = split_manifest(world, seed=13, derive=DERIVED_SPLIT_SIZES)
    old = stratified_split(world.examples, {"valid": 0.5, "test": 0.5}, seed=13, name="synthetic")
    assert m.splits == old.splits  # what TuningData drew for the synthetic world before
    changed = Dataset("hotpotqa", world.corpus, world.examples, {"f": "0" * 64}, builtin=True)
    with pytest.raises(DataError, match="hotpotqa.json"):
        split_manifest(changed, derive=DERIVED_SPLIT_SIZES)


def test_the_tuner_refuses_a_changed_builtin_dataset_like_eval_does(tmp_path):
    """`rl.common.data.split_manifest` (own-data splits for `ragpilot tune`) goes through the same
    `committed_manifest` check: a built-in whose files changed is never re-split."""
    from rl.common.data import split_manifest as tuner_split

    world = load_dataset("synthetic")
    changed = Dataset("hotpotqa", world.corpus, world.examples, {"f": "0" * 64}, builtin=True)
    with pytest.raises(DataError, match="hotpotqa.json.*restore the original files"):
        tuner_split(changed, "hotpotqa", tmp_path)
    assert not (tmp_path / "split.json").exists()  # nothing drawn, nothing written
