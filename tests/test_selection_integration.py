"""Selection on real components: pools from the synthetic world's real indexes (MiniLM, tantivy,
FAISS, graph) through the memo cache, RLlib PPO initialised from BC, and the CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl.common.data import TuningData
from rl.selection.bc import train_bc
from rl.selection.config import SelectionConfig
from rl.selection.data import SelectionData
from rl.selection.features import CAND_DIM
from rl.selection.policy import rollout
from rl.selection.rewards import SelectionReward, selection_metrics
from serving.cli import main


@pytest.fixture(scope="module")
def sel(world, world_indexes, tmp_path_factory):
    from rag.corpus.hygiene import stratified_split
    from rag.corpus.loaders import Dataset

    ds = Dataset("synthetic", world.corpus, world.examples, {})
    man = stratified_split(ds.examples, {"train": 0.5, "valid": 0.25, "test": 0.25}, seed=13,
                           name="synthetic")
    by_id = {e.id: e for e in ds.examples}
    splits = {s: [by_id[i] for i in ids] for s, ids in man.splits.items()}
    data = TuningData("synthetic", ds, world_indexes, splits)
    cfg = SelectionConfig.load().replace(**{"bc.epochs": 15, "ppo.train_batch_size": 32,
                                            "ppo.minibatch_size": 16, "ppo.num_epochs": 1})
    return SelectionData("synthetic", cfg, root=tmp_path_factory.mktemp("memo"), data=data)


def test_pools_from_memoised_retrieval(sel):
    ex = sel.examples("train", 12)
    pools = sel.pools("train", 12)
    assert len(pools) == 12 and all(p.n == 20 for p in pools)
    p = pools[0]
    assert p.static.shape == (20, len(p.static[0])) and p.emb.shape == (20, 384)
    assert np.allclose(np.linalg.norm(p.emb, axis=1), 1.0, atol=1e-3)
    # cosine rerank order really sorts by cosine relevance
    rel = p.rel[p.rerank_order]
    assert np.all(np.diff(rel) <= 1e-6)
    # gold passages are found for most single-hop questions
    assert np.mean([len(q.gold) > 0 for q in pools]) > 0.5
    # second build: served by the memo (no new rows), same candidates
    rows = sel.memo.store._db.execute("SELECT COUNT(*) FROM memo").fetchone()[0]
    again = sel.pool(ex[0])
    assert again.ids == p.ids
    assert sel.memo.store._db.execute("SELECT COUNT(*) FROM memo").fetchone()[0] == rows


def test_ppo_starts_from_bc_weights_and_trains(sel):
    from rl.selection.ppo import SelectionPPO

    cfg = sel.cfg
    pools = sel.pools("train", 16)
    rw = SelectionReward(cfg.reward)
    net, _ = train_bc(pools, rw, cfg.bc, cfg.env.k, cfg.env.max_steps)
    ppo = SelectionPPO(cfg, pools, rw, init=net)
    try:
        ppo.build()
        start = ppo.net()
        for a, b in zip(start.state_dict().values(), net.state_dict().values(), strict=True):
            assert torch.allclose(a, b)
        trained, info = ppo.train(1)
    finally:
        ppo.stop()
    assert info["iterations"] == 1 and info["initialised_from"] == "bc+raft"
    assert np.isfinite(info["curve"][0]["episode_return_mean"])
    changed = any(not torch.allclose(a, b) for a, b in zip(
        trained.state_dict().values(), net.state_dict().values(), strict=True))
    assert changed
    sel_ = rollout(trained, pools[0], cfg.env.k, cfg.env.max_steps).selected
    assert 1 <= len(sel_) <= cfg.env.max_steps and len(set(sel_)) == len(sel_)
    row = selection_metrics(rw, pools[0], sel_)
    assert 0.0 <= row["support_f1"] <= 1.0
    assert pools[0].static.shape[1] + 6 == CAND_DIM


def test_cli_bad_input_exits_2(capsys, tmp_path):
    assert main(["select", "run", "--set", "env.k=33"]) == 2
    assert "selection.env.k" in capsys.readouterr().err
    assert main(["select", "run", "--split", "valid"]) == 2
    assert "--split" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("selection:\n  raft:\n    samplez: 3\n")
    assert main(["select", "ablate", "--config", str(bad)]) == 2
    assert "selection.raft.samplez" in capsys.readouterr().err
    # checked before any Ray runtime starts
    assert main(["select", "ablate", "--parallel", "0"]) == 2
    assert "--parallel" in capsys.readouterr().err


def test_pluggable_final_reward(sel, tmp_path):
    """Faithfulness (real QualityScorer) and a saved reward model join the final reward when
    their weights are on; a missing reward model is skipped, not an error."""
    from rag.metrics.reward_model import FEATURES, RewardModel

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, len(FEATURES)))
    rm_dir = RewardModel.fit(X + 0.5, X).save(tmp_path, "rm-test")
    pool = sel.pools("valid", 3)[0]
    chosen = pool.rerank_order[:2]
    base_cfg = sel.cfg.reward
    plain = SelectionReward(base_cfg)
    full = SelectionReward(base_cfg.model_copy(update={
        "faithfulness": 1.0, "reward_model": 0.5, "reward_model_name": str(rm_dir)}))
    assert full.has_reward_model
    total, parts = full.final(pool, chosen)
    p_total, p_parts = plain.final(pool, chosen)
    assert set(parts) >= {"reward_model", "answer_f1"} and "reward_model" not in p_parts
    assert -1.0 <= parts["reward_model"] <= 1.0
    faith = parts.get("faithfulness", float("nan"))
    extra = (0.0 if np.isnan(faith) else faith) + 0.5 * parts["reward_model"]
    assert total == pytest.approx(p_total + extra)
    missing = SelectionReward(base_cfg.model_copy(update={
        "reward_model": 1.0, "reward_model_name": str(tmp_path / "nope")}))
    assert not missing.has_reward_model
    assert missing.final(pool, chosen)[0] == pytest.approx(p_total)


@pytest.fixture
def local_registry(tmp_path, monkeypatch):
    """An empty local model registry under a temporary cache (reset before and after)."""
    from rag.models import local_registry_path, reset_default_registry

    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RAGPILOT_MODELS", raising=False)
    reset_default_registry()
    yield local_registry_path()
    reset_default_registry()


def _register_tiny_cross_encoder(registry_file, tmp_path, name: str) -> None:
    """A 1-layer randomly initialised BERT cross-encoder (MiniLM's tokenizer), registered the
    way `ragpilot train-reranker` registers `<name>@best`."""
    import yaml
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from rag.models import default_registry, reset_default_registry

    tok = AutoTokenizer.from_pretrained(str(default_registry().get("minilm").resolve()))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=64, num_labels=1)
    path = tmp_path / "tiny-ce"
    BertForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    registry_file.parent.mkdir(parents=True, exist_ok=True)
    registry_file.write_text(yaml.safe_dump({"models": {name: {
        "kind": "cross_encoder", "format": "hf", "path": str(path)}}}))
    reset_default_registry()


def test_reranker_ablation_runs_the_registered_cross_encoder_or_says_why_not(
        sel, local_registry, tmp_path):
    from rag.rerank import make_reranker
    from rl.selection.ablate import Sizes, ablation_rows
    from rl.selection.data import cross_encoder_status

    cfg = sel.cfg.replace(**{"raft.rounds": 0})
    assert cfg.env.reranker_model == "reranker-minilm@best"  # the shipped config
    sizes = Sizes(train=8, valid=4, test=4, ks=(), lambdas=(), raft_rounds_ablation=0)
    train, valid, test = (sel.pools(s, n) for s, n in (("train", 8), ("valid", 4),
                                                       ("test", 4)))
    rw = SelectionReward(cfg.reward)
    bc, _ = train_bc(train, rw, cfg.bc, cfg.env.k, cfg.env.max_steps)
    # nothing registered: the arm is reported as not run, never silently dropped
    notes: dict = {}
    rows = ablation_rows("synthetic", cfg, sel, train, valid, test, rw, bc, sizes,
                         lambda m: None, notes)
    assert notes["reranker=cross_encoder"].startswith("not run: no cross-encoder registered")
    systems = {r["system"] for r in rows}
    assert "ablation:reranker=cosine rerank" in systems
    assert not any("cross_encoder" in s for s in systems)
    assert cross_encoder_status("minilm") == (
        None, "not run: no cross-encoder registered ('minilm' is a encoder)")
    # a registered cross-encoder: the arm runs, its pools are ordered by that model
    _register_tiny_cross_encoder(local_registry, tmp_path, "reranker-minilm@best")
    assert cross_encoder_status("reranker-minilm@best") == ("reranker-minilm@best", "")
    notes = {}
    rows = ablation_rows("synthetic", cfg, sel, train, valid, test, rw, bc, sizes,
                         lambda m: None, notes)
    assert notes == {}
    systems = {r["system"] for r in rows}
    assert {"ablation:reranker=cross_encoder rerank",
            "ablation:reranker=cross_encoder bc_raft"} <= systems
    ce_cfg = cfg.replace(**{"env.reranker": "cross_encoder"})
    pool = sel.pools("test", 1, ce_cfg)[0]
    ce = make_reranker("cross_encoder", "reranker-minilm@best")
    passages = [sel.data.indexes.corpus[i] for i in pool.ids]
    scores = ce.scores(pool.query, passages)
    assert [pool.ids[i] for i in pool.rerank_order] == \
        [pool.ids[i] for i in sorted(range(pool.n), key=lambda i: (-scores[i], i))]
