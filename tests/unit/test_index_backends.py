"""Index backends chosen by configuration (rag.index.settings, the `indexes:` section).

1. Validation: unknown keys and bad values are ConfigErrors naming the key.
2. The IndexSet manifest stores the settings; reopening uses them (and refuses another backend).
3. The FAISS device by config: the CPU path for real; `gpu` here (no GPU faiss build) is a loud
   ConfigError naming the key, never a CPU fallback. On a GPU machine the GPU test runs instead.
4. OpenSearch selected by config, through the real opensearch-py client, against FakeOpenSearch:
   a FAKE in-process HTTP server that mimics the few OpenSearch endpoints the backend calls
   (toy term-overlap scoring, exact cosine kNN). It checks the wiring only (config -> IndexSet ->
   client -> HTTP -> Pipeline); ranking quality against a real cluster is the contract test in
   tests/test_opensearch_contract.py (test_contract_backends_selected_by_config), which runs
   when RAGPILOT_OPENSEARCH_URL is set and is reported as SKIPPED otherwise.

Passage vectors come from FakeEncoder (hash-seeded unit vectors) so no model is loaded; the
embedding cache is redirected to tmp_path.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from rag.config import RAGConfig
from rag.errors import ConfigError, DataError
from rag.index.dense import FAISS_DEVICE_ENV, faiss_gpu_available
from rag.index.settings import OPENSEARCH_URL_ENV, IndexSettings
from rag.indexset import IndexSet

REPO = Path(__file__).resolve().parents[2]


class FakeEncoder:
    """Deterministic unit vectors from a hash of the text (no model)."""

    name, dim, fingerprint = "fake", 8, "fake-8"

    def encode(self, texts, batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        out = []
        for t in texts:
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little")
            v = np.random.default_rng(seed).normal(size=self.dim)
            out.append(v / np.linalg.norm(v))
        return np.asarray(out, dtype=np.float32)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setattr("rag.index.dense.cache_dir", lambda: tmp_path / "cache")
    monkeypatch.setattr(IndexSet, "encoder", lambda self: FakeEncoder())
    monkeypatch.delenv(FAISS_DEVICE_ENV, raising=False)
    monkeypatch.delenv(OPENSEARCH_URL_ENV, raising=False)
    monkeypatch.delenv("RAGPILOT_OPENSEARCH_VERIFY", raising=False)


# ---- 1. validation ---------------------------------------------------------------------------
@pytest.mark.parametrize(("data", "field"), [
    ({"lexcial": "opensearch"}, "indexes.lexcial"),
    ({"lexical": "elastic"}, "indexes.lexical"),
    ({"dense": "hnsw"}, "indexes.dense"),
    ({"faiss_device": "tpu"}, "indexes.faiss_device"),
    ({"dense": "opensearch", "faiss_device": "cpu"}, "indexes.faiss_device"),
    ({"opensearch": {"url": "ftp://search:9200"}}, "indexes.opensearch.url"),
    ({"opensearch": {"url": "http://host:port"}}, "indexes.opensearch.url"),
    ({"opensearch": {"index_prefix": "Rag Pilot"}}, "indexes.opensearch.index_prefix"),
    ({"opensearch": {"timeout_s": 0}}, "indexes.opensearch.timeout_s"),
    ({"opensearch": {"hosts": ["a"]}}, "indexes.opensearch.hosts"),
    ({"opensearch": "http://h:9200"}, "indexes.opensearch"),
])
def test_bad_settings_name_the_key(data, field) -> None:
    with pytest.raises(ConfigError) as e:
        IndexSettings.from_dict(data)
    assert e.value.field == field


def test_errors_never_echo_credentials_and_yaml_sections(tmp_path) -> None:
    with pytest.raises(ConfigError) as e:
        IndexSettings.from_dict({"opensearch": {"url": "ftp://admin:s3cret@h:9200"}})
    assert "s3cret" not in str(e.value)
    documented = IndexSettings.from_yaml(REPO / "configs/rag/indexes.yaml")
    assert documented == IndexSettings()  # the documented file and the code defaults agree
    both = tmp_path / "both.yaml"
    both.write_text("rag: {variant: bm25}\nindexes:\n  lexical: bm25s\n  faiss_device: cpu\n")
    assert IndexSettings.section_from_yaml(both) == IndexSettings(lexical="bm25s",
                                                                  faiss_device="cpu")
    assert RAGConfig.from_yaml(both).variant == "bm25"  # the rag section is unaffected
    assert IndexSettings.section_from_yaml(REPO / "configs/rag/default.yaml") is None
    bad = tmp_path / "bad.yaml"
    bad.write_text("indexes:\n  dense: faiss\n  opensearch: {url: 'http://h:9200', tls: no}\n")
    with pytest.raises(ConfigError, match=r"indexes\.opensearch\.tls: unknown key"):
        IndexSettings.from_yaml(bad)


def test_cli_rejects_a_bad_indexes_section(tmp_path, tiny_corpus, capsys) -> None:
    from serving.cli import main

    tiny_corpus.save(tmp_path / "c.jsonl")
    cfg = tmp_path / "i.yaml"
    cfg.write_text("indexes: {dense: annoy}\n")
    rc = main(["index", "--dataset", str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "ix"),
               "--config", str(cfg)])
    assert rc == 2 and "indexes.dense" in capsys.readouterr().err
    assert not (tmp_path / "ix").exists()


# ---- 2. manifest round trip ------------------------------------------------------------------
def test_manifest_round_trip_and_backend_identity(tmp_path, tiny_corpus) -> None:
    root = tmp_path / "ix"
    idx = IndexSet.create(tiny_corpus, root, indexes={"lexical": "bm25s", "faiss_device": "cpu"},
                          show_progress=False)
    stored = json.loads((root / "manifest.json").read_text())["indexes"]
    assert stored == IndexSettings(lexical="bm25s", faiss_device="cpu").to_manifest()
    assert stored["lexical"] == "bm25s" and stored["opensearch"]["url"] is None
    assert idx.bm25("bm25s").search("capital of France", 2)[0].id == "paris"
    assert idx.dense("flat").faiss_device == "cpu"
    with pytest.raises(ConfigError) as e:  # pinned: a config asking tantivy is refused
        idx.bm25("tantivy")
    assert e.value.field == "indexes.lexical" and "bm25_backend" in e.value.message

    back = IndexSet.open(root)
    assert back.settings == idx.settings
    assert back.build_all(dense=("flat",), graph=False) == {}  # loaded, nothing rebuilt
    assert back.dense("flat").faiss_device == "cpu"
    # where a backend runs may change on reopening; which backend it is may not
    assert IndexSet.open(root, indexes={"faiss_device": None}).settings.faiss_device == "cpu"
    with pytest.raises(ConfigError) as e:
        IndexSet.open(root, indexes={"lexical": "tantivy"})
    assert e.value.field == "indexes.lexical" and "new directory" in e.value.message
    with pytest.raises(ConfigError) as e:
        IndexSet.open(root, indexes=IndexSettings.from_yaml(REPO / "configs/rag/indexes.yaml"))
    assert e.value.field == "indexes.lexical"  # the defaults file says lexical: null

    legacy = json.loads((root / "manifest.json").read_text())
    del legacy["indexes"]  # a directory indexed before the setting existed: the defaults
    (root / "manifest.json").write_text(json.dumps(legacy))
    assert IndexSet.open(root).settings == IndexSettings()
    legacy["indexes"] = {"lexical": "lucene"}
    (root / "manifest.json").write_text(json.dumps(legacy))
    with pytest.raises(DataError) as e:
        IndexSet.open(root)
    assert "manifest.json" in e.value.path and "indexes.lexical" in e.value.message


def test_cli_index_then_query_use_the_stored_backend(tmp_path, tiny_corpus, capsys) -> None:
    from serving.cli import main

    tiny_corpus.save(tmp_path / "c.jsonl")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("rag: {variant: bm25, bm25_backend: bm25s, k: 2, n_candidates: 3}\n"
                   "indexes: {lexical: bm25s, faiss_device: cpu}\n")
    out = tmp_path / "ix"
    assert main(["index", "--dataset", str(tmp_path / "c.jsonl"), "--out", str(out),
                 "--config", str(cfg), "--no-graph"]) == 0
    printed = capsys.readouterr().out
    assert "lexical: bm25s" in printed and (out / "bm25-bm25s").is_dir()
    assert not (out / "bm25-tantivy").exists()
    assert json.loads((out / "manifest.json").read_text())["indexes"]["lexical"] == "bm25s"
    assert main(["query", "Which city is the capital of France?", "--index", str(out),
                 "--config", str(cfg)]) == 0
    assert "(paris," in capsys.readouterr().out
    # the rag defaults (bm25_backend tantivy) on this index: refused, naming the key
    assert main(["query", "capital of France", "--index", str(out)]) == 2
    assert "indexes.lexical" in capsys.readouterr().err


# ---- 3. FAISS device by config ---------------------------------------------------------------
def test_faiss_cpu_by_config_beats_the_environment(tmp_path, tiny_corpus, monkeypatch) -> None:
    root = tmp_path / "ix"
    IndexSet.create(tiny_corpus, root, indexes={"faiss_device": "cpu"}, show_progress=False)
    monkeypatch.setenv(FAISS_DEVICE_ENV, "cpu")
    idx = IndexSet.open(root, indexes={"faiss_device": "cpu"})
    d = idx.dense("flat")
    assert d.faiss_device == "cpu"
    q = FakeEncoder().encode(["Paris. Paris is the capital and largest city of France."])
    hit = d.search_vectors(q, 1)[0][0]
    assert hit.id == "paris" and hit.score == pytest.approx(1.0, abs=1e-5)
    if not faiss_gpu_available():
        # an explicit setting wins over the environment ...
        monkeypatch.setenv(FAISS_DEVICE_ENV, "gpu")
        assert IndexSet.open(root, indexes={"faiss_device": "cpu"}).dense("flat").faiss_device \
            == "cpu"
        # ... and the environment over the manifest, loudly when it asks for what is missing
        with pytest.raises(ConfigError) as e:
            IndexSet.open(root)
        assert e.value.field == FAISS_DEVICE_ENV


@pytest.mark.skipif(faiss_gpu_available(), reason="this faiss has GPU support")
def test_faiss_gpu_by_config_fails_loudly_without_a_gpu_build(tmp_path, tiny_corpus,
                                                             monkeypatch, capsys) -> None:
    with pytest.raises(ConfigError) as e:
        IndexSet.create(tiny_corpus, tmp_path / "ix", indexes={"faiss_device": "gpu"})
    assert e.value.field == "indexes.faiss_device" and "faiss-gpu-cu12" in e.value.message
    assert not (tmp_path / "ix").exists()  # checked before anything is written
    # a directory indexed on a GPU machine, opened here: the stored key is named
    IndexSet.create(tiny_corpus, tmp_path / "cpu", show_progress=False)
    m = json.loads((tmp_path / "cpu" / "manifest.json").read_text())
    m["indexes"]["faiss_device"] = "gpu"
    (tmp_path / "cpu" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ConfigError) as e:
        IndexSet.open(tmp_path / "cpu")
    assert e.value.field == "indexes.faiss_device"
    monkeypatch.setenv(FAISS_DEVICE_ENV, "cpu")  # a deployment's override (Serve runtime_env)
    assert IndexSet.open(tmp_path / "cpu").dense("flat").faiss_device == "cpu"
    monkeypatch.delenv(FAISS_DEVICE_ENV)
    from serving.cli import main

    tiny_corpus.save(tmp_path / "c.jsonl")
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text("indexes: {faiss_device: gpu}\n")
    assert main(["index", "--dataset", str(tmp_path / "c.jsonl"), "--out",
                 str(tmp_path / "cli"), "--config", str(cfg)]) == 2
    assert "indexes.faiss_device" in capsys.readouterr().err


@pytest.mark.skipif(not faiss_gpu_available(),
                    reason="no GPU faiss build or no GPU visible (docs/operations.md: FAISS on "
                           "the GPU)")
def test_faiss_gpu_by_config_runs_on_the_gpu(tmp_path, tiny_corpus) -> None:
    idx = IndexSet.create(tiny_corpus, tmp_path / "ix", indexes={"faiss_device": "gpu"},
                          show_progress=False)
    d = idx.dense("flat")
    assert d.faiss_device == "cuda"
    q = FakeEncoder().encode(["Rome. Rome is the capital city of Italy, founded on seven hills."])
    assert d.search_vectors(q, 1)[0][0].id == "rome"
    with pytest.raises(ConfigError) as e:  # no GPU HNSW in faiss
        idx.dense("hnsw")
    assert e.value.field == "indexes.faiss_device"


# ---- 4. OpenSearch by config, against a FAKE server -------------------------------------------
class FakeOpenSearch:
    """FAKE OpenSearch HTTP API on 127.0.0.1 (an ephemeral port), in a thread. Implements only
    what rag.index.opensearch sends: GET /, HEAD|PUT|DELETE /<index>, POST /_bulk,
    POST /<index>/_refresh, GET /<index>/_count, POST /<index>/_search with a `match` query
    (toy scoring: summed idf of shared lower-case word tokens, not BM25) or a `knn` query (exact
    cosine, score (1 + cos) / 2 like the cosinesimil space). Optional basic auth."""

    def __init__(self, auth: tuple[str, str] | None = None):
        self.indices: dict[str, dict[str, dict]] = {}
        self.requests: list[tuple[str, str]] = []
        self.auth = auth
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _reply(self, code: int, body=None):
                data = json.dumps(body if body is not None else {}).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _handle(self):
                n = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(n).decode() if n else ""
                path = self.path.split("?", 1)[0]
                fake.requests.append((self.command, path))
                if fake.auth is not None:
                    want = "Basic " + base64.b64encode(":".join(fake.auth).encode()).decode()
                    if self.headers.get("authorization") != want:
                        return self._reply(401, {"error": "unauthorized", "status": 401})
                code, body = fake.route(self.command, path, raw)
                self._reply(code, body)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, auth: str = "") -> str:
        return f"http://{auth + '@' if auth else ''}127.0.0.1:{self.port}"

    def close(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()
            self.thread.join()

    def count(self, method: str, suffix: str) -> int:
        return sum(m == method and p.endswith(suffix) for m, p in self.requests)

    # ---- the API ----------------------------------------------------------------------------
    def route(self, method: str, path: str, raw: str):
        parts = [p for p in path.split("/") if p]
        if not parts:
            return 200, {"name": "fake", "cluster_name": "fake",
                         "version": {"distribution": "opensearch", "number": "2.19.1"},
                         "tagline": "FAKE: tests/unit/test_index_backends.py"}
        if parts == ["_bulk"]:
            lines = [json.loads(x) for x in raw.splitlines() if x.strip()]
            items = []
            for action, doc in zip(lines[::2], lines[1::2], strict=True):
                meta = action["index"]
                self.indices.setdefault(meta["_index"], {})[meta["_id"]] = doc
                items.append({"index": {"_id": meta["_id"], "status": 201}})
            return 200, {"errors": False, "items": items}
        name = parts[0]
        if len(parts) == 1:
            if method == "HEAD":
                return (200 if name in self.indices else 404), None
            if method == "PUT":
                self.indices[name] = {}
                return 200, {"acknowledged": True, "index": name}
            if method == "DELETE":
                self.indices.pop(name, None)
                return 200, {"acknowledged": True}
        if name not in self.indices:
            return 404, {"error": {"type": "index_not_found_exception"}, "status": 404}
        docs = self.indices[name]
        if parts[1] == "_refresh":
            return 200, {"_shards": {"failed": 0}}
        if parts[1] == "_count":
            return 200, {"count": len(docs)}
        if parts[1] == "_search":
            q = json.loads(raw or "{}")
            return 200, {"hits": {"hits": self.search(docs, q["query"], q["size"])}}
        return 400, {"error": f"FAKE does not implement {method} {path}"}

    @staticmethod
    def _terms(text: str) -> set[str]:
        return set(re.findall(r"[a-z0-9]+", text.lower()))

    def search(self, docs: dict[str, dict], query: dict, size: int) -> list[dict]:
        if "match" in query:
            terms = self._terms(query["match"]["body"]["query"])
            df = {t: sum(t in self._terms(d["body"]) for d in docs.values()) for t in terms}
            scored = [(sum(math.log(1 + len(docs) / df[t]) for t in terms
                           if t in self._terms(d["body"])), pid) for pid, d in docs.items()]
            scored = [(s, pid) for s, pid in scored if s > 0]
        else:
            spec = query["knn"]["embedding"]
            v = np.asarray(spec["vector"])
            scored = [((1 + float(v @ np.asarray(d["embedding"]))) / 2, pid)
                      for pid, d in docs.items()]
            size = min(size, spec["k"])
        scored.sort(key=lambda x: (-x[0], x[1]))
        return [{"_id": pid, "_score": s} for s, pid in scored[:size]]


@pytest.fixture
def fake_os():
    server = FakeOpenSearch()
    yield server
    server.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


OS_BOTH = {"lexical": "opensearch", "dense": "opensearch"}


def test_opensearch_by_config_serves_the_pipeline(tmp_path, tiny_corpus, fake_os,
                                                  monkeypatch) -> None:
    pytest.importorskip("opensearchpy", reason="opensearch-py not installed (opensearch extra)")
    from rag.index.opensearch import OpenSearchRetriever
    from rag.pipeline import Pipeline

    fake_os.auth = ("reader", "pw")
    root = tmp_path / "ix"
    settings = {**OS_BOTH, "opensearch": {"url": fake_os.url("reader:pw"), "index_prefix": "t"}}
    idx = IndexSet.create(tiny_corpus, root, indexes=settings, show_progress=False)
    stored = json.loads((root / "manifest.json").read_text())["indexes"]
    assert stored["opensearch"]["url"] == fake_os.url()  # credentials are never stored
    assert "pw" not in (root / "manifest.json").read_text()

    bm25, dense = idx.bm25("tantivy"), idx.dense("hnsw")  # the config's choices do not matter
    assert isinstance(bm25, OpenSearchRetriever) and (bm25.mode, dense.mode) == ("bm25", "knn")
    name = f"t-{tiny_corpus.fingerprint()}"
    assert list(fake_os.indices) == [name] and len(fake_os.indices[name]) == len(tiny_corpus)
    assert fake_os.count("POST", "/_bulk") == 1  # one index serves both modes
    assert bm25.search("capital of France", 3)[0].id == "paris"
    q = "Rome. Rome is the capital city of Italy, founded on seven hills."
    assert dense.search(q, 2)[0].id == "rome"
    assert dense.passage_embeddings(["rome"]).shape == (1, FakeEncoder.dim)

    pipe = Pipeline(idx, RAGConfig(variant="hybrid", k=2, n_candidates=5, mmr_lambda=0.5))
    ans = pipe.run("Which city is the capital of France?")
    assert "paris" in ans.context_ids
    assert fake_os.count("POST", f"/{name}/_search") >= 4

    # reopened from the manifest (URL there, credentials from the environment): no rebuild
    monkeypatch.setenv(OPENSEARCH_URL_ENV, fake_os.url("reader:pw"))
    back = IndexSet.open(root)
    assert back.settings.lexical == "opensearch" and back.settings.dense == "opensearch"
    assert back.bm25("bm25s").search("capital of Italy", 1)[0].id == "rome"
    assert fake_os.count("POST", "/_bulk") == 1
    fake_os.indices.clear()  # the cluster lost the index: rebuilt on first use
    assert IndexSet.open(root).dense("flat").search(q, 1)[0].id == "rome"
    assert fake_os.count("POST", "/_bulk") == 2


def test_opensearch_by_config_needs_a_reachable_url(tmp_path, tiny_corpus, fake_os,
                                                    monkeypatch) -> None:
    pytest.importorskip("opensearchpy", reason="opensearch-py not installed (opensearch extra)")
    from rag.index.opensearch import OpenSearchUnreachable

    with pytest.raises(ConfigError) as e:  # no URL anywhere
        IndexSet.create(tiny_corpus, tmp_path / "a", indexes={"lexical": "opensearch"})
    assert e.value.field == "indexes.opensearch.url" and "no URL" in e.value.message
    dead = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(OpenSearchUnreachable) as e:
        IndexSet.create(tiny_corpus, tmp_path / "b", indexes={
            "dense": "opensearch", "opensearch": {"url": dead, "timeout_s": 2}})
    assert e.value.field == "indexes.opensearch.url" and dead in e.value.message
    assert not (tmp_path / "b").exists()
    monkeypatch.setenv(OPENSEARCH_URL_ENV, dead)  # the URL's source is the key named
    with pytest.raises(OpenSearchUnreachable) as e:
        IndexSet.create(tiny_corpus, tmp_path / "c", indexes={"lexical": "opensearch"})
    assert e.value.field == OPENSEARCH_URL_ENV
    monkeypatch.delenv(OPENSEARCH_URL_ENV)
    fake_os.auth = ("reader", "pw")  # reachable, but the credentials are refused
    with pytest.raises(OpenSearchUnreachable) as e:
        IndexSet.create(tiny_corpus, tmp_path / "d", indexes={
            "lexical": "opensearch", "opensearch": {"url": fake_os.url("reader:wrong")}})
    msg = str(e.value)
    assert "wrong" not in msg and "401" in msg
    # a directory whose cluster went away fails on open, naming the stored key
    fake_os.auth = None
    root = tmp_path / "e"
    IndexSet.create(tiny_corpus, root, indexes={"lexical": "opensearch", "opensearch": {
        "url": fake_os.url()}}, show_progress=False).bm25()
    fake_os.close()
    with pytest.raises(OpenSearchUnreachable) as e:
        IndexSet.open(root)
    assert e.value.field == "indexes.opensearch.url"


# ---- 5. Serve: replicas open the directory's stored backends; the launcher passes env_vars ----
def test_serve_replicas_and_launcher_pass_index_settings(tmp_path, tiny_corpus) -> None:
    pytest.importorskip("ray", reason="the rl extra (Ray Serve) is not installed")
    import yaml

    from serving.launch import app_env_vars, read_serve_yaml
    from serving.pipelines import open_served_data

    root = tmp_path / "ix"
    IndexSet.create(tiny_corpus, root, indexes={"lexical": "bm25s"}, show_progress=False)
    idx, gold = open_served_data(None, str(root))
    assert idx.settings.lexical == "bm25s" and gold == {}
    idx, _ = open_served_data(None, str(root), {"faiss_device": "cpu"})
    assert (idx.settings.lexical, idx.settings.faiss_device) == ("bm25s", "cpu")

    _, apps = read_serve_yaml(REPO / "configs/serve/default.yaml")
    assert app_env_vars(apps[0]) == {}
    # the documented (commented-out) runtime_env block is valid once uncommented
    text = (REPO / "configs/serve/default.yaml").read_text()
    text = (text.replace("    # runtime_env:", "    runtime_env:")
            .replace("    #   env_vars:", "      env_vars:")
            .replace("    #     RAGPILOT_", "        RAGPILOT_"))
    app = yaml.safe_load(text)["applications"][0]
    assert app_env_vars(app) == {"RAGPILOT_FAISS_DEVICE": "gpu",
                                 "RAGPILOT_OPENSEARCH_URL": "https://user:pw@os:9200"}
    with pytest.raises(ConfigError) as e:
        app_env_vars({"runtime_env": {"env_vars": {"RAGPILOT_FAISS_DEVICE": 1}}})
    assert e.value.field == "applications.0.runtime_env.env_vars"


def test_a_served_index_directory_must_hold_the_named_dataset(tmp_path, tiny_corpus) -> None:
    """`serve.index_dir` with `serve.dataset`: the directory must be built from that dataset's
    corpus (else its gold matches no served context: every score a silent zero), and then the
    dataset's gold scores answers; without `dataset` it serves with no gold. The app refuses the
    mismatch when it is built, before any replica starts."""
    pytest.importorskip("ray", reason="the rl extra (Ray Serve) is not installed")
    from rag.corpus.loaders import load_dataset
    from serving.app import build_app
    from serving.pipelines import open_served_data

    other = tmp_path / "other"
    IndexSet.create(tiny_corpus, other, show_progress=False)
    with pytest.raises(ConfigError) as e:
        open_served_data("synthetic", str(other))
    assert e.value.field == "serve.dataset" and "or to null" in str(e.value)
    with pytest.raises(ConfigError) as e:
        build_app({"dataset": "synthetic", "index_dir": str(other),
                   "store_url": str(tmp_path / "s.sqlite")})
    assert e.value.field == "serve.dataset"
    assert not (tmp_path / "s.sqlite").exists()

    ds = load_dataset("synthetic")
    own = tmp_path / "own"
    IndexSet.create(ds.corpus, own, show_progress=False)
    idx, gold = open_served_data("synthetic", str(own))
    assert len(gold) == len({e.question.strip().lower() for e in ds.examples}) > 0
    assert idx.corpus.fingerprint() == ds.corpus.fingerprint()
    assert open_served_data(None, str(own))[1] == {}
    with pytest.raises(ConfigError) as e:  # the setting is named, and the path
        build_app({"index_dir": str(tmp_path / "absent"),
                   "store_url": str(tmp_path / "s.sqlite")})
    assert e.value.field == "serve.index_dir" and "absent" in e.value.message


def test_ragpilot_serve_refuses_a_mismatched_index_before_ray_starts(tmp_path, tiny_corpus,
                                                                      capsys) -> None:
    pytest.importorskip("ray", reason="the rl extra (Ray Serve) is not installed")
    import ray
    import yaml

    from serving.cli import main

    other = tmp_path / "other"
    IndexSet.create(tiny_corpus, other, show_progress=False)
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(yaml.safe_dump({"applications": [{
        "name": "ragpilot", "import_path": "serving.app:build_app",
        "args": {"dataset": "synthetic", "index_dir": str(other),
                 "store_url": str(tmp_path / "s.sqlite")}}]}))
    was_up = ray.is_initialized()
    assert main(["serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "error: serve.dataset:" in err and str(other) in err
    assert ray.is_initialized() == was_up and not (tmp_path / "s.sqlite").exists()


def test_an_index_directory_of_another_corpus_is_refused_not_mixed(tmp_path, tiny_corpus):
    """Indexing into a directory that holds another corpus's index used to rewrite its corpus
    and manifest while keeping the old sub-indexes: queries then failed on ids of the old
    corpus (KeyError), and the fingerprint check that guards serving passed. Now: DataError,
    nothing written. The same corpus again reuses the directory; an empty corpus is refused."""
    from rag.corpus import Corpus
    from rag.types import Passage

    root = tmp_path / "ix"
    IndexSet.create(tiny_corpus, root, show_progress=False)
    before = {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}
    other = Corpus([Passage("x1", "Tokyo is the capital of Japan.", "Tokyo")])
    with pytest.raises(DataError) as e:
        IndexSet.create(other, root, show_progress=False)
    assert "another corpus" in str(e.value) and other.fingerprint() in str(e.value)
    assert {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()} == before
    IndexSet.create(tiny_corpus, root, show_progress=False)  # the same corpus: reused
    with pytest.raises(DataError, match="no passages"):
        IndexSet.create(Corpus([]), tmp_path / "empty", show_progress=False)
    assert not (tmp_path / "empty").exists()


def test_a_tampered_or_incomplete_index_directory_is_a_data_error(tmp_path, tiny_corpus):
    """A corpus.jsonl replaced after indexing (queries then failed with KeyError on ids it no
    longer held), a manifest that is not JSON or missing (tracebacks), an empty index."""
    import shutil

    from rag.corpus import Corpus
    from rag.types import Passage

    root = tmp_path / "ix"
    IndexSet.create(tiny_corpus, root, show_progress=False)
    IndexSet.open(root)  # intact
    cases = {"swapped": lambda d: Corpus([Passage("x1", "Tokyo.", "Tokyo")]).save(
                 d / "corpus.jsonl"),
             "bad-manifest": lambda d: (d / "manifest.json").write_text("[1, 2"),
             "list-manifest": lambda d: (d / "manifest.json").write_text("[1, 2]"),
             "no-manifest": lambda d: (d / "manifest.json").unlink()}
    for name, damage in cases.items():
        d = tmp_path / name
        shutil.copytree(root, d)
        damage(d)
        with pytest.raises(DataError) as e:
            IndexSet.open(d)
        assert str(d) in str(e.value), (name, e.value)
