"""`ragpilot eval --policy DIR`: a trained per-query policy's picks answer the questions, scored
like any eval; each question is answered by exactly the config the policy picked for it, and
its scores equal those of that config evaluated alone."""

import json

import numpy as np
import pytest

from rag.config import RAGConfig
from serving.cli import main

ARMS = [RAGConfig(generator="extractive", variant="bm25", k=1),
        RAGConfig(generator="extractive", variant="dense", k=5)]


@pytest.fixture(scope="module")
def index_dir(world_indexes):
    return str(world_indexes.root)


class SplitOnFeature:
    """Arm 1 where feature column `col` is above `cut`, else arm 0 (greedy, one-hot probs)."""

    def __init__(self, col: int, cut: float):
        self.arms, self.col, self.cut = ARMS, col, cut

    def act(self, X):
        return (np.asarray(X)[:, self.col] > self.cut).astype(int)

    def probs(self, X):
        return np.eye(len(self.arms))[self.act(X)]


def _policy_dir(tmp_path, index_dir, examples):
    from rag.indexset import IndexSet
    from rl.routing.base import save_policy
    from rl.routing.features import FEATURE_NAMES, QueryFeaturizer

    base = RAGConfig(generator="extractive")
    X = QueryFeaturizer.for_names(IndexSet.open(index_dir), base, FEATURE_NAMES).matrix(examples)
    col = int(np.argmax(X.std(axis=0)))
    pol = SplitOnFeature(col, float(np.median(X[:, col])))
    d = save_policy(pol, tmp_path / "policy", base_config=base, names=["bm25-k1", "dense-k5"],
                    feature_names=FEATURE_NAMES)
    return d, pol.act(X)


def test_eval_policy_answers_each_question_with_its_pick(index_dir, world, tmp_path, capsys):
    examples = world.examples[:16]
    d, picks = _policy_dir(tmp_path, index_dir, examples)
    assert 0 < picks.sum() < len(picks)  # both arms serve some questions
    rc = main(["eval", "--dataset", "synthetic", "--split", "all", "--index", index_dir,
               "--limit", "16", "--policy", str(d), "--out", str(tmp_path / "e")])
    assert rc == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "questions per arm" in out and "f1" in out
    preds = [json.loads(x) for x in (tmp_path / "e" / "predictions.jsonl").read_text()
             .splitlines()]
    assert [p["query_id"] for p in preds] == [e.id for e in examples]
    assert [p["config_hash"] for p in preds] == [ARMS[j].config_hash for j in picks]
    summary = json.loads((tmp_path / "e" / "summary.json").read_text())
    assert summary["arm_counts"] == {"bm25-k1": int((picks == 0).sum()),
                                     "dense-k5": int((picks == 1).sum())}
    assert summary["n"] == 16 and len(summary["policy"]["id"]) == 12
    scores = [json.loads(x) for x in (tmp_path / "e" / "scores.jsonl").read_text().splitlines()]
    # each question's scores are its arm's, evaluated alone
    rc = main(["eval", "--dataset", "synthetic", "--split", "all", "--index", index_dir,
               "--limit", "16", "--set", "variant=dense", "--set", "k=5", "--set",
               "generator=extractive", "--out", str(tmp_path / "dense")])
    assert rc == 0
    alone = [json.loads(x) for x in (tmp_path / "dense" / "scores.jsonl").read_text()
             .splitlines()]
    for s, a, j in zip(scores, alone, picks, strict=True):
        if j == 1:
            assert s["f1"] == a["f1"], (s, a)
    assert np.mean([s["f1"] for s in scores]) == pytest.approx(summary["f1"])


def test_eval_policy_bad_input_exits_2_naming_it(index_dir, world, tmp_path, capsys):
    d, _ = _policy_dir(tmp_path, index_dir, world.examples[:8])
    base = ["eval", "--dataset", "synthetic", "--index", index_dir, "--out", str(tmp_path / "o")]
    assert main([*base, "--policy", str(d), "--set", "k=3"]) == 2
    assert "--policy" in capsys.readouterr().err
    assert main([*base, "--policy", str(tmp_path / "nothing")]) == 2
    assert "policy_dir" in capsys.readouterr().err
