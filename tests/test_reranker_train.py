"""Cross-encoder reranker training: config validation, pair mining, curriculum, checkpoint and
resume, versioned save + registration, the CLI. Unit tests use a tiny randomly initialised BERT;
one slow test trains the real packaged MiniLM weights on a handful of pairs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag.errors import ConfigError, DataError
from rag.types import Example, Hit, Passage
from rl.adaptation.data import TrainItem, load_items, mine_items, save_items
from rl.adaptation.reranker_config import RerankerTrainConfig
from rl.adaptation.reranker_export import register_local, save_model
from rl.adaptation.reranker_trainer import (
    item_order,
    make_batch,
    negatives_for,
    plan_steps,
    train_reranker,
)

WORDS = ["statin", "heart", "river", "castle", "violin", "protein", "glacier", "tennis",
         "comet", "insulin", "desert", "opera"]


def _items(n: int = 12) -> list[TrainItem]:
    """A toy task a 1-layer random BERT learns in a few dozen steps: positives carry the
    query's topic word and a marker word ("evidence") that negatives never contain."""
    out = []
    for i in range(n):
        w = WORDS[i % len(WORDS)]
        others = [x for x in WORDS if x != w]
        out.append(TrainItem("toy", f"q{i}", f"what about {w}?", f"{w} evidence evidence about {w}.",
                             tuple(f"{o} facts about {o}." for o in others[:6]),
                             tuple(f"{o} and more {o}." for o in others[6:])))
    return out


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    """A 1-layer random BERT saved like a bi-encoder (no classifier head) + the real tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from rag.models import ModelRegistry

    d = tmp_path_factory.mktemp("tiny-bert")
    tok = AutoTokenizer.from_pretrained(str(ModelRegistry().get("minilm").resolve()))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    BertModel(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _cfg(base, **kw) -> RerankerTrainConfig:
    return RerankerTrainConfig.from_dict({
        "name": "tiny-ce", "base_model": str(base), "max_length": 32, "group_size": 4,
        "batch_groups": 2, "lr": 1e-3, "head_lr": 1e-2, "warmup_frac": 0.1,
        "checkpoint_every": 2, "threads": 1, "eval": None, "mlflow": False, **kw})


# ---- config -------------------------------------------------------------------------------------
def test_shipped_config_loads_and_bad_keys_are_named(tmp_path):
    cfg = RerankerTrainConfig.from_yaml("configs/rl/reranker.yaml")
    assert cfg.max_length == 192 and set(cfg.data.sources) == {"scifact", "hotpotqa", "mtrag"}
    bad = tmp_path / "r.yaml"
    bad.write_text("reranker:\n  data:\n    depht: 30\n")
    with pytest.raises(ConfigError, match=r"reranker\.data\.depht"):
        RerankerTrainConfig.from_yaml(bad)
    bad.write_text("reranker:\n  data:\n    sources:\n      scifact: {split: test}\n")
    with pytest.raises(ConfigError, match=r"reranker\.data\.sources\.scifact\.split"):
        RerankerTrainConfig.from_yaml(bad)
    with pytest.raises(ConfigError, match=r"reranker\.group_size"):
        RerankerTrainConfig.from_dict({"group_size": 1})
    with pytest.raises(ConfigError, match=r"reranker\.eval\.split"):
        RerankerTrainConfig.from_dict({"eval": {"split": "test"}})


# ---- mining -------------------------------------------------------------------------------------
def test_mining_excludes_gold_and_refuses_non_train_queries(tmp_path):
    from rag.corpus import Corpus

    corpus = Corpus([Passage(f"p{i}", f"text {i}", f"T{i}") for i in range(20)])
    exs = [Example(id="a", question="qa", gold_passage_ids=("p0", "p1")),
           Example(id="b", question="qb", gold_passage_ids=("p5",)),
           Example(id="c", question="qc")]  # no gold: skipped

    def retrieve(q):
        return [Hit(1.0 - i / 10, f"p{i}") for i in range(8)]

    items = mine_items("toy", exs, corpus, ["a", "b", "c"], retrieve, n_hard=4, n_easy=3)
    assert [(i.query_id, i.positive) for i in items] == [("a", "T0. text 0"), ("a", "T1. text 1"),
                                                         ("b", "T5. text 5")]
    a, b = items[0], items[2]
    assert a.hard == ("T2. text 2", "T3. text 3", "T4. text 4", "T5. text 5")  # gold removed
    assert "T5. text 5" not in b.hard and len(b.hard) == 4
    for it in items:
        assert len(it.easy) == 3 and it.positive not in it.easy
    with pytest.raises(DataError, match="not in the train split"):
        mine_items("toy", exs, corpus, ["a", "c"], retrieve)  # b is a valid/test query
    path = tmp_path / "items.jsonl"
    save_items(items, path)
    assert load_items(path) == items


def test_mining_on_real_scifact_respects_the_split():
    """The SciFact train split (qrels/train.tsv) mined with BM25 over the real corpus."""
    from conftest import require_dataset

    require_dataset("scifact")
    from rag.corpus.hygiene import load_split
    from rl.adaptation.data import mine_from_dataset

    items = mine_from_dataset("scifact", "train", "bm25", 10, 5, 2, 6, 0)
    train = set(load_split("scifact").ids("train"))
    assert items and {i.query_id for i in items} <= train
    assert all(i.positive not in i.hard and len(i.hard) == 5 for i in items)
    with pytest.raises(ConfigError, match="split"):
        mine_from_dataset("scifact", "test", "bm25", 10, 5, 2, 6, 0)


# ---- curriculum ---------------------------------------------------------------------------------
def test_curriculum_hard_first_then_mixed_and_batches_are_pure_functions_of_step(tiny_base):
    import random

    it = _items(1)[0]
    for s in range(20):
        neg = negatives_for(it, 3, True, 2, random.Random(s))
        assert set(neg[:2]) == set(it.hard[:2])  # the two hardest always come first
    late = [negatives_for(it, 3, False, 2, random.Random(s)) for s in range(30)]
    assert all(any(n in it.easy for n in neg) for neg in late)  # random negatives appear
    assert any(n in it.hard[2:] for neg in late for n in neg)  # deeper retrieval ranks too
    cfg = _cfg(tiny_base, hard_phase=0.5)
    items = _items(12)
    steps = plan_steps(cfg, len(items))
    assert steps == 6
    order = item_order(cfg, len(items), steps)
    assert sorted(order) == list(range(12))  # one epoch visits every item once
    b1, b2 = make_batch(cfg, items, order, 4, steps), make_batch(cfg, items, order, 4, steps)
    assert b1 == b2 and len(b1[0]) == 8
    q, p = make_batch(cfg, items, order, 0, steps)
    assert p[0] == items[order[0]].positive and q[0] == items[order[0]].query


# ---- training, checkpoint, resume ----------------------------------------------------------------
def test_resume_after_a_stop_ends_where_an_uninterrupted_run_ends(tiny_base, tmp_path):
    cfg = _cfg(tiny_base, epochs=1.0)
    items = _items(12)
    full = train_reranker(cfg, items, tmp_path / "full")
    assert full.finished and full.steps_done == 6 and len(full.losses) == 6
    part = train_reranker(cfg, items, tmp_path / "cut", stop_after=3)
    assert not part.finished and part.steps_done == 3
    assert (tmp_path / "cut" / "checkpoint.pt").exists()
    rest = train_reranker(cfg, items, tmp_path / "cut")
    assert rest.resumed_from == 3 and rest.finished and rest.steps_done == 6
    assert np.allclose(rest.losses, full.losses, atol=1e-5)
    for (n, a), (_, b) in zip(full.model.state_dict().items(),
                              rest.model.state_dict().items(), strict=True):
        assert np.allclose(a.numpy(), b.numpy(), atol=1e-5), n
    assert rest.sequences == full.sequences == 6 * 8
    with pytest.raises(ConfigError, match="another config"):
        train_reranker(_cfg(tiny_base, lr=5e-4), items, tmp_path / "cut")


def test_training_learns_the_toy_task(tiny_base, tmp_path):
    """Loss falls and the trained head ranks held-in positives above negatives."""
    import torch

    cfg = _cfg(tiny_base, epochs=6.0, hard_phase=0.3, loss="listwise", lr=3e-3, head_lr=3e-2)
    items = _items(12)
    res = train_reranker(cfg, items, tmp_path / "learn")
    assert np.mean(res.losses[-6:]) < 0.6 * np.mean(res.losses[:6])
    enc = res.tokenizer([i.query for i in items] * 2,
                        [i.positive for i in items] + [i.hard[0] for i in items],
                        padding=True, return_tensors="pt")
    with torch.inference_mode():
        s = res.model(**enc).logits[:, 0].numpy()
    assert (s[:12] > s[12:]).mean() >= 0.9
    margin = _cfg(tiny_base, epochs=3.0, loss="margin", lr=3e-3, head_lr=3e-2)
    res_m = train_reranker(margin, items, tmp_path / "margin")
    assert np.mean(res_m.losses[-4:]) < np.mean(res_m.losses[:4])


# ---- save, register, select -------------------------------------------------------------------
def test_saved_versions_register_and_become_selectable(tiny_base, tmp_path, monkeypatch):
    from rag.models import default_registry, local_registry_path, reset_default_registry
    from rag.rerank import CrossEncoderReranker, make_reranker
    from rl.adaptation.reranker_export import next_version_dir

    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RAGPILOT_MODELS", raising=False)
    reset_default_registry()
    cfg = _cfg(tiny_base)
    res = train_reranker(cfg, _items(4), tmp_path / "run")
    dirs = []
    for metric in (0.4, 0.7, 0.5):  # v2 is the best on the eval metric
        d = next_version_dir(cfg.name)
        save_model(res, cfg, d, {"scifact_valid_ndcg@10": metric}, {"toy": {"items": 4}})
        dirs.append(d)
        aliases = register_local(cfg.name, d, "scifact_valid_ndcg@10")
    assert [d.name for d in dirs] == ["v1", "v2", "v3"]
    assert aliases == {"latest": str(dirs[2]), "best": str(dirs[1])}
    man = json.loads((dirs[0] / "manifest.json").read_text())
    assert man["steps"] == 2 and man["data_hash"] == res.data_hash and man["created"]
    assert man["base_model"] == str(tiny_base) and (dirs[0] / "model.safetensors").exists()
    assert local_registry_path().exists()
    reg = default_registry()
    assert reg.get("tiny-ce").resolve() == dirs[2]
    assert reg.get("tiny-ce@best").resolve() == dirs[1]
    assert "tiny-ce@v1" in reg.names("cross_encoder")
    # the serving path loads it by name and scores like the in-memory model
    passages = [Passage("a", "statin statin facts about statin.", ""),
                Passage("b", "river facts about river.", "")]
    rr = make_reranker("cross_encoder", "tiny-ce", registry=reg)
    assert isinstance(rr, CrossEncoderReranker)
    import torch

    enc = res.tokenizer(["what about statin?"] * 2, [p.text for p in passages], padding=True,
                        truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        ref = res.model(**enc).logits[:, 0].numpy()
    assert np.allclose(rr.scores("what about statin?", passages), ref, atol=1e-5)
    from rag.config import RAGConfig

    RAGConfig(rerank="cross_encoder", reranker_model="tiny-ce@best")  # a valid RAG config
    reset_default_registry()


def test_cli_bad_input_exits_2_naming_the_field(capsys):
    from serving.cli import main

    assert main(["train-reranker", "--set", "bogus=1"]) == 2
    assert "reranker.bogus" in capsys.readouterr().err
    assert main(["train-reranker", "--set", "max_length=4"]) == 2
    assert "reranker.max_length" in capsys.readouterr().err
    assert main(["train-reranker", "--config", "/nonexistent.yaml"]) == 2
    assert main(["train-reranker", "--stop-after", "0", "--set", "max_items=1"]) == 2
    assert "--stop-after" in capsys.readouterr().err


# ---- the real packaged weights --------------------------------------------------------------
@pytest.mark.slow
def test_real_minilm_cross_encoder_trains_saves_and_serves(tmp_path):
    """The packaged all-MiniLM-L6-v2 weights become a cross-encoder: a few steps on real-ish
    pairs run, the saved model reloads through rag.rerank with the same scores."""
    import torch

    from rag.rerank import CrossEncoderReranker

    cfg = RerankerTrainConfig.from_dict({"name": "real-ce", "max_length": 64, "group_size": 2,
                                         "batch_groups": 2, "eval": None, "mlflow": False,
                                         "checkpoint_every": 1})
    items = [TrainItem("toy", "q1", "do statins lower cholesterol?",
                       "Statins lower LDL cholesterol in adults.", ("Paris is in France.",), ()),
             TrainItem("toy", "q2", "what is the capital of italy?",
                       "Rome is the capital city of Italy.", ("Dogs run in parks.",), ())]
    res = train_reranker(cfg, items, tmp_path / "run")
    assert res.finished and res.steps_done == 1 and np.isfinite(res.losses).all()
    assert res.tokens > 0 and res.tokens_per_s > 0
    assert sum(p.numel() for p in res.model.parameters()) > 20_000_000  # the real encoder
    d = tmp_path / "v1"
    save_model(res, cfg, d, {}, {})
    passages = [Passage("a", "Statins lower LDL cholesterol in adults.", ""),
                Passage("b", "Paris is in France.", "")]
    rr = CrossEncoderReranker(d)
    assert rr.max_length == 64  # served with the training cut, read from manifest.json
    served = rr.scores("do statins lower cholesterol?", passages)
    enc = res.tokenizer(["do statins lower cholesterol?"] * 2, [p.text for p in passages],
                        padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.inference_mode():
        ref = res.model(**enc).logits[:, 0].numpy()
    assert np.allclose(served, ref, atol=1e-4)


def test_mlflow_run_carries_commit_and_every_source_manifest(tiny_base, tmp_path, monkeypatch):
    """Issue 9: every MLflow run carries the code commit and the dataset manifest; a reranker
    mined from several datasets tags each source's input files."""
    import mlflow

    from rl.adaptation.reranker_export import log_mlflow, training_manifest

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    sources = {"scifact": {"split": "train", "items": 3, "manifest": {
                   "dataset": "scifact", "inputs": [{"path": "scifact/qrels/train.tsv",
                                                     "sha256": "ab" * 32}]}},
               "hotpotqa": {"split": "train", "items": 2, "manifest": {
                   "dataset": "hotpotqa", "inputs": [{"path": "hotpotqa/dev.jsonl",
                                                      "sha256": "cd" * 32}]}}}
    merged = training_manifest(sources)
    assert merged["dataset"] == "hotpotqa/train+scifact/train"
    assert {i["sha256"] for i in merged["inputs"]} == {"ab" * 32, "cd" * 32}
    cfg = _cfg(tiny_base, mlflow_dir=str(tmp_path / "mlflow"))
    d = tmp_path / "v1"
    d.mkdir()
    manifest = {"eval": {}, "pairs_per_s": 1.0, "tokens_per_s": 2.0, "steps": 1,
                "data_hash": "x", "data_sources": sources}
    out = log_mlflow(cfg, manifest, d, {"latest": str(d), "best": str(d)})
    run = mlflow.MlflowClient(out["tracking_uri"]).get_run(out["run_id"])
    tags = run.data.tags
    assert tags["code_commit"] and tags["code_commit"] != "unknown"
    assert tags["dataset"] == "hotpotqa/train+scifact/train"
    assert len(tags["dataset_manifest_sha256"]) == 64
    assert tags["dataset_sha256/scifact/qrels/train.tsv"] == "ab" * 32
