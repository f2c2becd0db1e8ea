"""`ragpilot tune --dataset <a BEIR folder>` (and `tuner-eval`, `report`) end to end (issue 18): data without a committed
split manifest gets a seeded split written next to the run and reused by a later run on the
same bytes; F and R default to what gold the data has (qrels: sig_combined / ndcg@10); `report`
compares the tuned config with the static default on the held-out half."""

import json

import pytest
import yaml

from serving.cli import main

TOPICS = ["volcano lava eruption magma", "glacier ice melt arctic", "river delta sediment flood",
          "desert dune sand wind", "coral reef ocean fish", "forest canopy rain tree",
          "comet orbit tail sun", "battery lithium charge cell", "violin string bow music",
          "bread yeast flour oven", "bridge steel cable span", "honey bee hive pollen",
          "chess bishop knight board", "tide moon gravity sea", "cheese milk curd aging",
          "kite string wind tail", "piano key hammer chord", "lighthouse beam coast ship",
          "cactus spine water desert", "satellite antenna signal orbit",
          "glass furnace silica blow"]
SMALL = {"policy": {"k_grid": [3, 5], "fusion_grid": 0.5, "fusion_step": 0.5,
                    "discrete": {"variant": ["bm25", "hybrid"], "rerank": ["off"],
                                 "prompt_id": ["cite_concise"],
                                 # pinned: the heads issue 18 added
                                 "normalisation": ["minmax"], "rerank_depth": [30]},
                    "bounds": {"mmr_lambda": {"min": 1.0, "max": 1.0}},
                    "episode": {"length": 3, "batch_size": 8}}}


def _beir(root, dangling: int = 0):
    """21 queries (an odd count), each with one relevant passage among 42; the first
    `dangling` queries also have a label naming a document absent from the corpus."""
    root.mkdir()
    (root / "qrels").mkdir()
    with (root / "corpus.jsonl").open("w") as f:
        for i, t in enumerate(TOPICS):
            f.write(json.dumps({"_id": f"d{i}", "title": t.split()[0],
                                "text": f"The {t} is described here in plain words."}) + "\n")
            f.write(json.dumps({"_id": f"x{i}", "title": "note",
                                "text": f"An unrelated note number {i} about nothing."}) + "\n")
    with (root / "queries.jsonl").open("w") as f:
        for i, t in enumerate(TOPICS):
            f.write(json.dumps({"_id": f"q{i}", "text": f"what about the {t}?"}) + "\n")
    rows = ["query-id\tcorpus-id\tscore"] + [f"q{i}\td{i}\t1" for i in range(len(TOPICS))] \
        + [f"q{i}\tgone{i}\t1" for i in range(dangling)]
    (root / "qrels" / "test.tsv").write_text("\n".join(rows) + "\n")
    return root


def test_tune_and_report_on_a_beir_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("rl.common.data.cache_dir", lambda: tmp_path / "cache")
    data = _beir(tmp_path / "mybeir", dangling=21)
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(SMALL))
    out1, out2 = tmp_path / "run1", tmp_path / "run2"
    args = ["tune", "--dataset", str(data), "--method", "random", "--budget", "3",
            "--settings", str(policy), "--no-mlflow"]
    assert main([*args, "--out", str(out1)]) == 0
    s1 = json.loads((out1 / "summary.json").read_text())
    # the split: made, stratified halves of 21, written next to the run and to the cache
    assert s1["split"]["source"] == "made"
    split1 = json.loads((out1 / "split.json").read_text())
    assert split1["counts"] == {"valid": 11, "test": 10} == s1["split"]["sizes"]
    assert not set(split1["splits"]["valid"]) & set(split1["splits"]["test"])
    assert list((tmp_path / "cache" / "splits").glob("mybeir-*.json"))
    # retrieval-only gold: F = the reference-free answer signal, R = nDCG@10
    assert s1["metrics"] == {"faithfulness": "sig_combined", "relevancy": "ndcg@10"}
    assert s1["holdout"]["split"] == "test" and s1["holdout"]["n"] == 10
    assert s1["dataset_name"] == "mybeir"
    # every query also names a document the corpus lacks: counted per split, and said on
    # stderr, but each still has a reachable label, so the run goes on
    gold = s1["gold"]
    assert set(gold) == {"valid", "test"}
    assert [gold[s]["labels_outside_corpus"] for s in ("valid", "test")] == [11, 10]
    assert gold["test"]["labels"] == 20 and gold["test"]["no_reachable_gold"] == 0
    assert "10 of 20 relevance labels (in 10 examples) name documents absent" in \
        gold["test"]["warnings"][0]
    assert "warning: mybeir (valid split): 11 of 22 relevance labels" in capsys.readouterr().err

    # tuner-eval on the same folder: the cached split, the tune half
    capsys.readouterr()
    assert main(["tuner-eval", "--dataset", str(data), "--set", "variant=bm25", "--set", "k=3",
                 "--settings", str(policy)]) == 0
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    assert rep["split"] == "valid" and rep["n"] == 11 and rep["dataset"] == "mybeir"
    assert len(rep["warnings"]) == 1 and "11 of 22 relevance labels" in rep["warnings"][0]
    assert "warning: mybeir (valid split): 11 of 22" in cap.err

    # a second run on the same bytes (a copy elsewhere) reuses the split by content hash
    copy = tmp_path / "elsewhere" / "mybeir"
    copy.parent.mkdir()
    import shutil

    shutil.copytree(data, copy)
    assert main([*args[:2], str(copy), *args[3:], "--out", str(out2)]) == 0
    s2 = json.loads((out2 / "summary.json").read_text())
    assert s2["split"]["source"] == "reused"
    assert json.loads((out2 / "split.json").read_text())["splits"] == split1["splits"]

    # the report compares the tuned config with the default on the held-out half
    capsys.readouterr()
    assert main(["report", "--run", str(out1), "--settings", str(policy), "--no-mlflow"]) == 0
    report = (out1 / "report.md").read_text()
    assert "| chosen − static default |" in report
    assert "Holdout `test`, n = 10 queries" in report
    assert "F = `sig_combined`, R = `ndcg@10`" in report and "reused split" in report
    assert "Gold the corpus cannot reach" in report
    assert "- `test`: 10 of 20 relevance labels (in 10 examples)" in report


def test_too_few_questions_is_a_data_error(tmp_path, monkeypatch):
    from rag.corpus.loaders import load_dataset
    from rag.errors import DataError
    from rl.common.data import split_manifest

    monkeypatch.setattr("rl.common.data.cache_dir", lambda: tmp_path / "cache")
    root = _beir(tmp_path / "tiny")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
    with pytest.raises(DataError, match="at least 2"):
        split_manifest(load_dataset(str(root)), str(root))


def test_policy_train_on_a_tiny_folder_warns_and_still_reports(tmp_path, monkeypatch, capsys):
    """21 questions: the router's cross-validation runs on ~10 valid queries, so the run is
    counted as a warning (report, report.json, stderr) rather than refused or silent."""
    monkeypatch.setattr("rl.common.data.cache_dir", lambda: tmp_path / "cache")
    data = _beir(tmp_path / "tinybeir")
    out = tmp_path / "policy"
    assert main(["router", "train", "--dataset", str(data), "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert len(rep["warnings"]) == 1 and "train ∪ valid queries" in rep["warnings"][0]
    assert rep["router"]["static_arm"] in rep["arms"] and rep["router"]["margin"] >= 0
    assert "Warnings (1):" in (out / "report.md").read_text()
    assert "warning: only" in capsys.readouterr().err


def test_tuner_eval_scores_unreachable_gold_only_on_request(tmp_path, monkeypatch, capsys):
    """A split whose gold is mostly outside the corpus is refused (tests/unit/test_silent_zeros)
    unless asked for; then it is scored, and the problem counted in the report and on stderr."""
    monkeypatch.setattr("rl.common.data.cache_dir", lambda: tmp_path / "cache")
    data = _beir(tmp_path / "gonebeir")
    rows = ["query-id\tcorpus-id\tscore"] + [f"q{i}\tgone{i}\t1" for i in range(len(TOPICS))]
    (data / "qrels" / "test.tsv").write_text("\n".join(rows) + "\n")
    args = ["tuner-eval", "--dataset", str(data), "--split", "test", "--set", "variant=bm25"]
    assert main(args) == 2
    assert "10 of 10 questions have no reachable gold" in capsys.readouterr().err
    assert main([*args, "--allow-missing-gold"]) == 0
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    # R (nDCG@10) needs the qrels: 0 with every label outside the corpus; F on qrels-only data
    # is the reference-free answer signal (sig_combined), which needs no gold, so it is scored
    assert rep["n"] == 10 and rep["relevancy"] == 0.0 and 0.0 < rep["faithfulness"] <= 1.0
    assert any("10 of 10 examples have no reachable gold" in w for w in rep["warnings"])
    assert "warning: gonebeir (test split): 10 of 10 relevance labels" in cap.err
