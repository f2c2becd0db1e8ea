"""The OpenSearch backend (rag.index.opensearch).

1. Contract (needs a server): the same queries on OpenSearch and on the local backends
   (tantivy BM25, FAISS flat kNN over the same MiniLM vectors, client-side hybrid fusion) over
   the synthetic world's corpus; top-10 overlaps must be high. Runs only against the server in
   $RAGPILOT_OPENSEARCH_URL, e.g.

       docker run -d -p 127.0.0.1:9200:9200 -e discovery.type=single-node \\
         -e DISABLE_SECURITY_PLUGIN=true opensearchproject/opensearch:2.19.1
       RAGPILOT_OPENSEARCH_URL=http://127.0.0.1:9200 .venv/bin/pytest -q \\
         tests/test_opensearch_contract.py

   Without it the contract test is reported as SKIPPED (never as passed).
2. Units (no server): mapping, bulk actions, query bodies, error paths, driven through a fake
   client that records requests and answers like the search API.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid

import numpy as np
import pytest

from rag.errors import ConfigError, DataError
from rag.fusion import hybrid_fuse
from rag.index import opensearch as osx
from rag.types import Hit


class FakeEncoder:
    """Deterministic unit vectors from a hash of the text (units only; the contract test and
    the rest of the suite use the real MiniLM)."""

    name, dim, fingerprint = "fake", 8, "fake-8"

    def encode(self, texts, batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        out = []
        for t in texts:
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little")
            v = np.random.default_rng(seed).normal(size=self.dim)
            out.append(v / np.linalg.norm(v))
        return np.asarray(out, dtype=np.float32)


class FakeIndices:
    def __init__(self, log):
        self.log, self.existing = log, set()

    def exists(self, index):
        return index in self.existing

    def create(self, index, body):
        self.log.append(("create", index, body))
        self.existing.add(index)

    def delete(self, index):
        self.log.append(("delete", index))
        self.existing.discard(index)

    def refresh(self, index):
        self.log.append(("refresh", index))


class FakeClient:
    """Records bulk and search requests; answers searches from `answers` by query type."""

    def __init__(self, answers=None, bulk_error=False):
        self.log: list = []
        self.indices = FakeIndices(self.log)
        self.answers = answers or {}
        self.bulk_error = bulk_error

    def bulk(self, body):
        lines = [json.loads(x) for x in body.splitlines()]
        self.log.append(("bulk", lines))
        items = [{"index": {"_id": a["index"]["_id"], "status": 201}} for a in lines[::2]]
        if self.bulk_error:
            items[-1]["index"]["error"] = {"type": "mapper_parsing_exception"}
        return {"errors": self.bulk_error, "items": items}

    def search(self, index, body, **params):
        self.log.append(("search", index, body, params))
        kind = next(iter(body["query"]))
        hits = [{"_id": i, "_score": s} for i, s in self.answers.get(kind, [])]
        return {"hits": {"hits": hits[:body["size"]]}}


def test_index_body_maps_knn_vector_and_analyser() -> None:
    b = osx.index_body(384)
    assert b["settings"]["index"]["knn"] is True
    vec = b["mappings"]["properties"]["embedding"]
    assert vec["type"] == "knn_vector" and vec["dimension"] == 384
    assert vec["method"]["name"] == "hnsw" and vec["method"]["space_type"] == "cosinesimil"
    assert b["mappings"]["properties"]["body"]["analyzer"] == osx.ANALYZER
    assert osx.ANALYZER in b["settings"]["analysis"]["analyzer"]
    with pytest.raises(ConfigError) as e:
        osx.index_body(0)
    assert e.value.field == "opensearch.dim"


def test_build_bulk_indexes_every_passage_with_its_vector(tiny_corpus, tmp_path,
                                                         monkeypatch) -> None:
    monkeypatch.setattr("rag.index.dense.cache_dir", lambda: tmp_path)  # keep fakes out
    enc, client = FakeEncoder(), FakeClient()
    client.indices.existing.add("t")  # replaced
    r = osx.OpenSearchRetriever.build(tiny_corpus, enc, url="http://u:pw@127.0.0.1:9200",
                                      index="t", mode="knn", client=client,
                                      directory=tmp_path / "os")
    kinds = [x[0] for x in client.log]
    assert kinds == ["delete", "create", "bulk", "refresh"]
    lines = client.log[2][1]
    assert len(lines) == 2 * len(tiny_corpus)
    assert [a["index"]["_id"] for a in lines[::2]] == tiny_corpus.ids
    docs = lines[1::2]
    from rag.index.dense import embed_corpus

    vecs = embed_corpus(tiny_corpus, enc, use_cache=False)
    assert np.allclose(np.array([d["embedding"] for d in docs]), vecs, atol=1e-6)
    assert docs[3]["body"] == "Paris\nParis is the capital and largest city of France."
    meta = json.loads((tmp_path / "os" / "opensearch.json").read_text())
    assert meta["url"] == "http://127.0.0.1:9200" and meta["index"] == "t"  # no credentials
    assert r.mode == "knn"
    back = osx.OpenSearchRetriever.load(tmp_path / "os", client=client, encoder=enc)
    assert (back.index, back.mode, back.fusion_weight) == ("t", "knn", 0.5)


def test_bulk_errors_are_typed(tiny_corpus, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("rag.index.dense.cache_dir", lambda: tmp_path)
    with pytest.raises(DataError) as e:
        osx.OpenSearchRetriever.build(tiny_corpus, FakeEncoder(), index="t", mode="bm25",
                                      client=FakeClient(bulk_error=True), url="http://h:9200")
    assert "opensearch.bulk" in e.value.path and "mapper_parsing_exception" in str(e.value)


def test_query_bodies_and_client_side_hybrid() -> None:
    enc = FakeEncoder()
    bm = [("a", 9.0), ("b", 5.0), ("c", 1.0)]
    kn = [("c", 0.9), ("a", 0.8), ("d", 0.5)]
    client = FakeClient({"match": bm, "knn": kn})
    r = osx.OpenSearchRetriever(client, "t", "hybrid", enc, fusion_weight=0.3)
    got = r.search('who "founded" AND the company?', top_n=3)
    want = hybrid_fuse([Hit(s, i) for i, s in bm], [Hit(s, i) for i, s in kn], 0.3,
                       "minmax", top_n=3)
    assert got == want
    (_, _, sparse, _), (_, _, dense, _) = client.log
    assert sparse["query"]["match"]["body"]["query"] == "who founded and the company"
    assert dense["query"]["knn"]["embedding"]["k"] == 3
    assert np.allclose(dense["query"]["knn"]["embedding"]["vector"],
                       enc.encode(['who "founded" AND the company?'])[0])
    server = osx.OpenSearchRetriever(client, "t", "hybrid", enc, fusion_weight=0.3,
                                     hybrid="server")
    client.answers["hybrid"] = [("d", 1.0)]
    assert server.search("company", top_n=2) == [Hit(1.0, "d")]
    _, _, body, params = client.log[-1]
    assert [next(iter(q)) for q in body["query"]["hybrid"]["queries"]] == ["match", "knn"]
    assert params == {"params": {"search_pipeline": "t-hybrid"}}
    pipe = osx.search_pipeline_body(0.3)
    proc = pipe["phase_results_processors"][0]["normalization-processor"]
    assert proc["combination"]["parameters"]["weights"] == pytest.approx([0.7, 0.3])


def test_bad_settings_name_the_key() -> None:
    cases = [(lambda: osx.OpenSearchRetriever(FakeClient(), "t", "sparse"), "opensearch.mode"),
             (lambda: osx.OpenSearchRetriever(FakeClient(), "t", "knn"), "encoder"),
             (lambda: osx.OpenSearchRetriever(FakeClient(), "t", "bm25", hybrid="x"),
              "opensearch.hybrid"),
             (lambda: osx.search_pipeline_body(1.5), "fusion_weight"),
             (lambda: osx.OpenSearchRetriever(FakeClient(), "t", "bm25").search("  "), "query"),
             (lambda: osx.OpenSearchRetriever(FakeClient(), "t", "bm25").search("x", 0),
              "top_n")]
    for fn, field in cases:
        with pytest.raises(ConfigError) as e:
            fn()
        assert e.value.field == field


def test_connect_builds_a_real_client_or_names_the_setting(monkeypatch) -> None:
    monkeypatch.delenv(osx.URL_ENV, raising=False)
    with pytest.raises(ConfigError) as e:
        osx.connect()
    assert e.value.field == osx.URL_ENV
    with pytest.raises(ConfigError):
        osx.connect("ftp://host")
    pytest.importorskip("opensearchpy", reason="opensearch-py not installed (opensearch extra)")
    c = osx.connect("https://admin:pw@search.example:9201")  # no request is sent
    (conn,) = c.transport.hosts
    assert (conn["host"], conn["port"], conn["scheme"]) == ("search.example", 9201, "https")


# ---- the contract, against a real server -------------------------------------------------------
@pytest.fixture(scope="module")
def server_url():
    url = os.environ.get(osx.URL_ENV)
    if not url:
        pytest.skip(f"{osx.URL_ENV} not set: no OpenSearch server, contract test NOT run "
                    "(docs/operations.md says how to run it)")
    pytest.importorskip("opensearchpy", reason="opensearch-py not installed (opensearch extra)")
    return url


def _overlap(a: list[Hit], b: list[Hit]) -> float:
    return len({h.id for h in a} & {h.id for h in b}) / max(len(b), 1)


def test_contract_same_top_k_as_local_backends(server_url, world, world_indexes) -> None:
    enc = world_indexes.encoder()
    name = f"ragpilot-contract-{uuid.uuid4().hex[:8]}"
    remote = osx.OpenSearchRetriever.build(world.corpus, enc, url=server_url, index=name,
                                           mode="bm25")
    try:
        bm25, dense = world_indexes.bm25("tantivy"), world_indexes.dense("flat")
        knn = osx.OpenSearchRetriever(remote.client, name, "knn", enc)
        hyb = osx.OpenSearchRetriever(remote.client, name, "hybrid", enc, fusion_weight=0.5)
        qs = [e.question for e in world.examples[:25]]
        ov = {"bm25": [], "knn": [], "hybrid": []}
        top1_knn = 0
        for q in qs:
            lb, ld = bm25.search(q, 10), dense.search(q, 10)
            rk = knn.search(q, 10)
            ov["bm25"].append(_overlap(remote.search(q, 10), lb))
            ov["knn"].append(_overlap(rk, ld))
            ov["hybrid"].append(_overlap(hyb.search(q, 10), hybrid_fuse(lb, ld, 0.5,
                                                                        top_n=10)))
            top1_knn += rk[0].id == ld[0].id
        means = {k: float(np.mean(v)) for k, v in ov.items()}
        print(f"top-10 overlap OpenSearch vs local over {len(qs)} queries: {means}; "
              f"kNN top-1 agreement {top1_knn}/{len(qs)}")
        assert means["knn"] >= 0.9 and top1_knn >= 0.9 * len(qs)   # same vectors, HNSW ~exact
        assert means["bm25"] >= 0.7     # BM25 with a different (Lucene) analyser chain
        assert means["hybrid"] >= 0.7
    finally:
        remote.client.indices.delete(index=name)


def test_contract_backends_selected_by_config(server_url, world, world_indexes,
                                              tmp_path) -> None:
    """OpenSearch chosen by the `indexes:` settings (what tests/unit/test_index_backends.py drives
    against a FAKE server) on the real cluster: IndexSet.create -> manifest -> open ->
    Pipeline, with the same overlap bars as above."""
    from rag.config import RAGConfig
    from rag.indexset import IndexSet
    from rag.pipeline import Pipeline

    prefix = f"ragpilot-contract-{uuid.uuid4().hex[:8]}"
    settings = {"lexical": "opensearch", "dense": "opensearch",
                "opensearch": {"url": server_url, "index_prefix": prefix}}
    idx = IndexSet.create(world.corpus, tmp_path / "ix", indexes=settings, show_progress=False)
    name = f"{prefix}-{world.corpus.fingerprint()}"
    try:
        bm25, knn = idx.bm25("tantivy"), idx.dense("flat")
        assert (bm25.index, knn.index) == (name, name)
        qs = [e.question for e in world.examples[:25]]
        ov_b = float(np.mean([_overlap(bm25.search(q, 10),
                                       world_indexes.bm25("tantivy").search(q, 10)) for q in qs]))
        ov_k = float(np.mean([_overlap(knn.search(q, 10),
                                       world_indexes.dense("flat").search(q, 10)) for q in qs]))
        print(f"by config: top-10 overlap bm25 {ov_b:.3f}, knn {ov_k:.3f}")
        assert ov_k >= 0.9 and ov_b >= 0.7
        back = IndexSet.open(tmp_path / "ix")
        assert (back.settings.lexical, back.settings.dense) == ("opensearch", "opensearch")
        cfg = RAGConfig(mmr_lambda=0.7)  # hybrid fusion + MMR over the OpenSearch lists
        remote = Pipeline(back, cfg).run(qs[0])
        local = Pipeline(world_indexes, cfg).run(qs[0])
        assert len(remote.contexts) == cfg.k
        assert len(set(remote.context_ids) & set(local.context_ids)) >= cfg.k // 2
    finally:
        idx.opensearch_client().indices.delete(index=name, ignore=[404])
