"""`TuningData` reads every qrels split of a BEIR folder that its manifest names (SciFact's
committed train ids live in qrels/train.tsv, not in the test qrels the loader reads)."""

from __future__ import annotations

import json

from rag.corpus.loaders import load_beir
from rl.common.data import with_manifest_qrels


def _beir(tmp_path):
    d = tmp_path / "toy"
    (d / "qrels").mkdir(parents=True)
    (d / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": f"doc {i}"}) + "\n"
                                            for i in range(4)))
    (d / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": f"q {i}"}) + "\n"
                                             for i in range(4)))
    (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\nq1\td1\t1\n")
    (d / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq2\td2\t1\nq3\td3\t1\n")
    return d


def test_manifest_train_ids_find_their_examples(tmp_path):
    ds = load_beir(_beir(tmp_path), "test")
    assert {e.id for e in ds.examples} == {"q0", "q1"}
    out = with_manifest_qrels(ds, {"test": ["q0", "q1"], "train": ["q2", "q3"]})
    by_id = {e.id: e for e in out.examples}
    assert set(by_id) == {"q0", "q1", "q2", "q3"}
    assert by_id["q2"].gold_passage_ids == ("d2",) and by_id["q2"].category == "train"


def test_unchanged_when_nothing_is_missing(tmp_path):
    ds = load_beir(_beir(tmp_path), "test")
    assert with_manifest_qrels(ds, {"test": ["q0"]}) is ds
