"""Selection on real components: pools from the synthetic world's real indexes (MiniLM, tantivy,
FAISS, graph) through the memo cache, RLlib PPO initialised from BC, and the CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl.evaluation import TuningData
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
