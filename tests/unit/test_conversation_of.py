"""One conversation grouping (`rag.types.conversation_of`): a user's explicit `conversation_id`
wins over the id's shape, MTRAG ids group by their prefix, and the folds and splits that use it
never cut a user's conversation."""

from __future__ import annotations

import json

import numpy as np

from rag.corpus.loaders import load_jsonl_examples
from rag.types import Example, conversation_of
from rl.stats.headroom import group_folds


def _user_file(tmp_path):
    """Six turns of three conversations whose ids say nothing about the conversation (and one
    id that looks like MTRAG's but belongs to another conversation)."""
    rows = [("t1", "support-7"), ("t2", "support-7"), ("t3", "billing-2"),
            ("billing-2<::>9", "support-7"), ("t5", "billing-2"), ("t6", "intro-1")]
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps({"id": i, "question": f"q {i}?",
                                        "metadata": {"conversation_id": c}}) + "\n"
                            for i, c in rows))
    return path, [c for _, c in rows]


def test_explicit_conversation_id_wins_over_the_id(tmp_path):
    path, want = _user_file(tmp_path)
    examples = load_jsonl_examples(path)
    assert [conversation_of(e) for e in examples] == want
    # the MTRAG-shaped id is grouped by its metadata, not by its prefix
    assert conversation_of(examples[3]) == "support-7" != examples[3].id.split("<::>")[0]


def test_mtrag_ids_and_single_questions():
    assert conversation_of(Example("c42<::>3", "q?")) == "c42"
    assert conversation_of(Example("c42<::>4", "q?", metadata={"conversation_id": ""})) == "c42"
    assert conversation_of(Example("hotpot-17", "q?")) == "hotpot-17"
    assert conversation_of(Example("x", "q?", metadata={"conversation_id": 7})) == "7"


def test_group_folds_keep_a_user_conversation_in_one_fold(tmp_path):
    path, _ = _user_file(tmp_path)
    groups = [conversation_of(e) for e in load_jsonl_examples(path)]
    folds = group_folds(groups, k=2, seed=0)
    for g in set(groups):
        assert len({int(f) for f, h in zip(folds, groups, strict=True) if h == g}) == 1
    assert len(set(folds.tolist())) == 2
    assert np.asarray(folds).shape == (6,)
