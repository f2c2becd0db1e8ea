"""Graph retriever (multi-hop reach, PPR mass), rerankers (cosine, a local cross-encoder), and
the dense index with the real packaged MiniLM."""

import numpy as np
import pytest

from rag.corpus import Corpus
from rag.errors import ConfigError
from rag.index.base import Retriever
from rag.index.bm25 import TantivyBM25
from rag.index.graph import GraphRetriever, extract_entities
from rag.rerank import CrossEncoderReranker, NoRerank, make_reranker
from rag.types import Hit, Passage

HOP = Corpus([
    Passage("firm", "Vornacle Systems is a software firm founded by Ada Quill in 1931.",
            "Vornacle Systems"),
    Passage("ada", "Ada Quill was a chemist born in Stenmouth. Quill later taught at Kelbridge.",
            "Ada Quill"),
    Passage("sten", "Stenmouth is a harbour town in Drovia.", "Stenmouth"),
    Passage("noise1", "Kelbridge has a university and a cathedral.", "Kelbridge"),
    Passage("noise2", "The software industry grew quickly after 1990.", "Software"),
    Passage("noise3", "A firm founded in 1931 in Drovia made glass.", "Glassworks"),
])


def test_entities_are_names_not_sentence_starts():
    ents = extract_entities("The firm grew. Ada Quill founded it in Stenmouth.")
    assert {"ada quill", "stenmouth"} <= ents and "the" not in ents


def test_graph_reaches_the_second_hop(tmp_path):
    bm25 = TantivyBM25.build(HOP, tmp_path / "bm25")
    q = "Where was the founder of Vornacle Systems born?"
    assert [h.id for h in bm25.search(q, 1)] == ["firm"]  # the only seed
    g = GraphRetriever.build(HOP, tmp_path / "graph", seeds=[bm25])
    hits = g.search(q, 6, n_seeds=1)  # seeded only by the single best lexical hit
    ids = [h.id for h in hits]
    # the walk reaches the founder's passage through the shared entity "ada quill"
    assert ids[0] == "firm" and ids[1] == "ada"
    seed = g.seed_vector(q, 1)
    mass = g.ppr(seed, 0.5)
    assert mass.sum() == pytest.approx(1.0, abs=1e-6) and (mass >= 0).all()
    again = GraphRetriever.load(tmp_path / "graph", seeds=[bm25])
    assert again.search(q, 6, n_seeds=1) == hits
    with pytest.raises(ConfigError, match="graph_damping"):
        g.search(q, 5, damping=1.0)


class _Fixed(Retriever):
    def __init__(self, hits):
        self.hits = hits

    def search(self, query, top_n=10):
        return self.hits[:top_n]

    def save(self, directory):
        pass

    @classmethod
    def load(cls, directory):
        raise NotImplementedError


def test_graph_without_any_seed_returns_nothing():
    g = GraphRetriever.build(HOP, seeds=[_Fixed([])])
    assert g.search("zzz qqq", 5) == []


def _tiny_cross_encoder(tmp_path):
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from rag.models import default_registry

    tok = AutoTokenizer.from_pretrained(str(default_registry().get("minilm").resolve()))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=64, num_labels=1)
    BertForSequenceClassification(cfg).save_pretrained(tmp_path / "ce")
    tok.save_pretrained(tmp_path / "ce")
    return tmp_path / "ce"


def test_cross_encoder_loads_from_a_local_dir_and_batches(tmp_path):
    path = _tiny_cross_encoder(tmp_path)
    passages = list(HOP)
    big = CrossEncoderReranker(path, batch_size=32).scores("who founded it?", passages)
    small = CrossEncoderReranker(path, batch_size=2).scores("who founded it?", passages)
    assert np.allclose(big, small, atol=1e-5)
    hits = make_reranker("cross_encoder", str(path)).rerank("who founded it?", passages)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert len(hits) == len(passages)
    with pytest.raises(ConfigError, match="reranker_model"):
        make_reranker("cross_encoder", "minilm")  # an encoder, not a cross-encoder
    with pytest.raises(ConfigError, match="rerank"):
        make_reranker("colbert")
    assert [h.id for h in NoRerank().rerank("q", passages)] == [p.id for p in passages]


@pytest.mark.slow
def test_dense_with_real_minilm(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path / "cache"))
    from rag.encoders import Encoder
    from rag.index.dense import DenseRetriever

    enc = Encoder.from_registry("minilm")
    flat = DenseRetriever.build(HOP, enc, "flat", tmp_path / "flat", show_progress=False)
    calls = enc.calls
    hnsw = DenseRetriever.build(HOP, enc, "hnsw", tmp_path / "hnsw", show_progress=False)
    assert enc.calls == calls  # corpus embeddings came from the cache
    q = "Which town on the coast is in Drovia?"
    assert flat.search(q, 1)[0].id == "sten"
    assert [h.id for h in flat.search(q, 3)] == [h.id for h in hnsw.search(q, 3)]
    again = DenseRetriever.load(tmp_path / "flat")
    assert again.search(q, 3) == flat.search(q, 3)
    v = flat.passage_embeddings(["sten", "ada"])
    assert v.shape == (2, enc.dim) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    cos = make_reranker("cosine", "minilm").rerank(q, list(HOP))
    assert cos[0].id == "sten"
    with pytest.raises(ConfigError, match="device"):
        DenseRetriever.build(HOP, enc, "flat", device="cuda", show_progress=False)
    assert isinstance(flat.search(q, 2)[0], Hit)
