"""The shared pipeline replica body (serving.shared_pipelines.SharedPipelineService), without
Ray, on the synthetic world: every variant answers exactly as its own one-config replica
(serving.pipelines.PipelineService) would, over ONE IndexSet and one model cache; the variant
cache is bounded; a config that does not hash to its variant id is refused.
"""

from __future__ import annotations

import pytest

from rag.config import RAGConfig
from rag.errors import ConfigError

BASE = {"generator": "extractive"}
VARIANTS = [BASE, {**BASE, "variant": "bm25"}, {**BASE, "variant": "dense", "k": 4},
            {**BASE, "k": 3, "fusion_weight": 0.7}]
QUESTIONS = ["Which company was founded first?", "Where was person 3 born?"]


@pytest.fixture(scope="module")
def shared():
    from serving.shared_pipelines import SharedPipelineService

    return SharedPipelineService("synthetic", max_variants=3, warmup=[BASE])


def _vid(cfg: dict) -> tuple[str, dict]:
    c = RAGConfig.from_dict(cfg)
    return c.config_hash, c.model_dump(mode="json")


def test_each_variant_answers_as_its_own_replica_would(shared):
    from serving.pipelines import PipelineService

    for cfg in VARIANTS[:2]:
        vid, js = _vid(cfg)
        own = PipelineService(js, "synthetic", warmup=False)
        for q in QUESTIONS:
            got, want = shared.answer(vid, js, q, "q1"), own.answer(q, "q1")
            for key in ("answer", "citations", "context_ids", "variant_id", "scores"):
                assert got[key] == want[key], (cfg, q, key)


def test_variants_share_one_index_set_and_model_cache(shared):
    views = [shared.pipeline_for(*_vid(cfg)) for cfg in VARIANTS[:3]]
    assert len({id(v.indexes) for v in views}) == 1
    assert len({id(v.resources) for v in views}) == 1
    assert [v.config.config_hash for v in views] == [_vid(c)[0] for c in VARIANTS[:3]]


def test_the_variant_cache_is_bounded_and_refuses_a_wrong_hash(shared):
    for cfg in VARIANTS:
        shared.answer(*_vid(cfg), QUESTIONS[0])
    info = shared.info()
    assert info["variants_loaded"] == [_vid(c)[0] for c in VARIANTS[1:]]  # LRU of 3
    vid, js = _vid(VARIANTS[1])
    with pytest.raises(ConfigError, match="hashes to"):
        shared.answer(vid, {**js, "k": 9}, QUESTIONS[0])
    probe = shared.info(vid, js)
    assert probe["variant_id"] == vid and probe["gold_questions"] > 0


def test_a_goldless_answer_is_scored_after_from_its_signal_input(shared):
    """No signals on the request path: a gold-less answer's record has no scores but its
    `signal_input`, from which `signals` gives exactly what AnswerSignals scores on the
    answer itself; a gold question's record is scored at once and has no signal_input."""
    from rag.corpus.synthetic import make_synthetic_world
    from serving.pipelines import SIGNAL_KEYS, answer_signals

    vid, js = _vid(BASE)
    own = make_synthetic_world().examples[0].question  # the served world's: gold known
    q = f"Tell me: {own}"  # reworded: no gold
    rec = shared.answer(vid, js, q, "q1")
    assert rec["scores"] is None and "signals" not in rec["latency_ms"]
    got = shared.signals(rec["signal_input"])
    want = answer_signals().score(shared.pipeline_for(vid, js).run(q, "q1"))
    assert got["scores"] == {k: want[k] for k in SIGNAL_KEYS} and got["ms"] > 0
    assert 0.0 < got["scores"]["sig_combined"] <= 1.0
    gold = shared.answer(vid, js, own, "q2")
    assert "f1" in gold["scores"] and "signal_input" not in gold
