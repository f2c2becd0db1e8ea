"""The pipeline replica body: `PipelineService` (one config) and `answer_record` (what a
replica returns), used by serving.shared_pipelines (the Serve deployment that answers for every
config variant), the in-process `local_app` and the load benchmark's baseline.

A replica opens the served dataset's indexes (built once, under a file lock, so replicas
starting together never build the same index twice), builds `rag.pipeline.Pipeline` for its
RAGConfig and answers one warm-up question before it reports ready (so the first user does not
pay the ~8 s model load). The index backends are those stored in the index directory's
manifest (`ragpilot index --config`; rag.index.settings), adjusted per deployment by
RAGPILOT_FAISS_DEVICE / RAGPILOT_OPENSEARCH_URL in the application's `runtime_env.env_vars`, or
by `indexes` overrides passed here. When the question is one of the dataset's own (gold known),
the answer is scored with `rag.metrics.score_answer`, the same scorer offline evaluation uses
(SCORE_KEYS). Every other answer needs the reference-free signals of `rag.metrics.signals`
(SIGNAL_KEYS, each in [0, 1]: from the question, the answer and its cited passages, with the
process's MiniLM, shared with a MiniLM dense index), so a rollout can judge quality where no gold
exists; they are not computed while the user waits: the record carries `signal_input` instead,
and the ingress asks a replica's `signals` (`score_signals`) for them once the answer is sent
and its row stored (serving.routes_query).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rag.config import RAGConfig
from rag.corpus.hygiene import gold_by_question, normalise_question
from rag.env import configure_runtime_env
from rag.errors import ConfigError, CorpusMismatchError

WARMUP_QUESTION = "Which company was founded first?"
DEFAULT_DATASET = "synthetic"
"""What a replica serves when neither a dataset nor an index directory is named."""
SCORE_KEYS = ("em", "f1", "support", "recall@k", "citation_precision", "sp_f1")
"""Gold-based scores of an answer to one of the served dataset's questions."""
SIGNAL_KEYS = ("sig_relevancy", "sig_faithfulness", "sig_combined")
"""Reference-free scores (rag.metrics.signals.SIGNALS) of an answer to any other question."""
SIGNAL_CACHE = 50_000
"""Texts whose MiniLM vectors a replica keeps for the signals (~75 MB): passages retrieved again
(by the next request, or by the mirrored variant of the same one) are not encoded again."""
_signals = None
_signals_lock = threading.Lock()


@contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fast_queries_in_replica() -> bool:
    """Inside a Ray Serve replica process, encode questions (calls of a few texts) on ONNX
    Runtime fp32: the same vectors as torch without torch's per-module overhead, which was
    most of a pipeline replica's CPU per request (rag.encoders.set_query_runtime;
    $RAGPILOT_QUERY_RUNTIME=torch keeps torch). Elsewhere (tests, in-process callers) the
    process-wide setting is left alone. True when switched."""
    try:
        from ray import serve

        serve.get_replica_context()
    except Exception:  # noqa: BLE001 - not in a replica (or no Ray): nothing to switch
        return False
    from rag.encoders import set_query_runtime

    return set_query_runtime("onnx") == "onnx"


def open_served_data(dataset: str | None = None, index_dir: str | None = None,
                     indexes: dict[str, Any] | None = None):
    """(IndexSet, {normalised question: Example}) that a replica serves:
    - `index_dir` alone: that directory, no gold (answers are logged, not scored);
    - `index_dir` and `dataset`: that directory, which must hold the dataset's corpus
      (`check_served_data`), and the dataset's gold;
    - `dataset` alone (default DEFAULT_DATASET): its indexes, built once under a file lock, and
      its gold.
    `indexes`: overrides of the directory's stored index settings (IndexSet.open).
    In a Serve replica, one-question encodes run on ONNX Runtime fp32 when it is installed
    (see fast_queries_in_replica)."""
    from rag.indexset import IndexSet
    from rag.models import cache_dir

    fast_queries_in_replica()

    with _file_lock(cache_dir() / "indexes" / ".serve.lock"):
        if index_dir:
            return check_served_data(dataset, index_dir, indexes)
        from rl.common.data import TuningData

        data = TuningData.open(dataset or DEFAULT_DATASET)
        gold = gold_by_question(data.dataset.examples)
        if indexes is not None:
            return IndexSet.open(data.indexes.root, indexes=indexes), gold
        return data.indexes, gold


def check_served_data(dataset: str | None, index_dir: str,
                      indexes: dict[str, Any] | None = None):
    """(IndexSet, gold) of an index directory served as `dataset`: a DataError when it is not
    an index directory, a ConfigError naming `serve.dataset` when it is named and the directory
    was built from another corpus (its gold would match none of the served contexts: every
    score a silent zero). `serving.app.preflight` calls it before Ray starts, so `ragpilot
    serve` exits 2 naming the problem instead of each replica failing to start."""
    from rag.indexset import IndexSet

    idx = IndexSet.open(index_dir, indexes=indexes)
    if dataset is None:
        return idx, {}
    from rag.corpus.loaders import load_dataset

    ds = load_dataset(dataset)
    try:
        idx.check_corpus(ds.corpus, dataset)
    except CorpusMismatchError as e:
        raise ConfigError("serve.dataset", f"{index_dir} was built from corpus "
                          f"{e.index_fingerprint}, not from {dataset}'s ({e.dataset_fingerprint}): "
                          f"set `dataset` to the dataset the directory was indexed from, or to "
                          f"null to serve it without gold") from None
    return idx, gold_by_question(ds.examples)


class PipelineService:
    """The replica body, usable without Ray (tests, the benchmark's in-process baseline)."""

    def __init__(self, config: dict[str, Any], dataset: str | None = None,
                 index_dir: str | None = None, warmup: bool = True,
                 indexes: dict[str, Any] | None = None):
        configure_runtime_env()
        from rag.pipeline import Pipeline

        self.config = RAGConfig.from_dict(config)
        indexes, self.gold = open_served_data(dataset, index_dir, indexes)
        self.pipeline = Pipeline(indexes, self.config)
        self.variant_id = self.config.config_hash
        if warmup:
            warm_up(self.pipeline)  # loads models, builds any missing index

    def answer(self, question: str, query_id: str = "q", history=None) -> dict[str, Any]:
        """Answer one question (after `history`'s turns). Latency per stage in ms; `scores`
        when gold is known."""
        return answer_record(self.pipeline, self.gold, question, query_id, history)

    def signals(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`score_signals(payload)`: the reference-free signals of an answer this replica gave."""
        return score_signals(payload)

    def info(self) -> dict[str, Any]:
        return {"variant_id": self.variant_id, "config": self.config.model_dump(mode="json"),
                "pid": os.getpid(), "gold_questions": len(self.gold)}


def answer_signals():
    """The process's `rag.metrics.signals.AnswerSignals`, built on first use: encoder calls of
    two texts (each one-question-sized call runs on the query runtime, ONNX in a replica) and a
    cache of SIGNAL_CACHE texts."""
    global _signals
    with _signals_lock:
        if _signals is None:
            from rag.metrics.signals import AnswerSignals

            _signals = AnswerSignals(chunk=2)
            _signals.embedder.max_cache = SIGNAL_CACHE
        return _signals


def warm_up(pipeline) -> None:
    """Answer WARMUP_QUESTION and score it with the signals: loads every model a request
    needs (the pipeline's and the signals' encoder) before the replica reports ready."""
    answer_signals().score(pipeline.run(WARMUP_QUESTION))


def answer_record(pipeline, gold: dict[str, Any], question: str,
                  query_id: str = "q", history=None) -> dict[str, Any]:
    """Run `pipeline` on one question: what a replica returns (answer, citations, ids,
    latency per stage in ms, tokens, variant id, `scores` and `gold_category`: `add_scores`).
    `history`: the conversation's earlier turns ({"role", "text"} dicts), which the config's
    query formulation may use."""
    ans = pipeline.run(question, query_id, history=history or None)
    return add_scores(answer_fields(ans), ans, gold, question, pipeline.config.k)


def answer_fields(ans, **override: Any) -> dict[str, Any]:
    """A replica's answer record of the `rag.types.Answer` `ans` before `add_scores`: answer,
    citations, cited and context ids, latency per stage (ms), tokens in and out, variant id
    (the answer's config hash); `override` replaces any of them (a policy's summed latency and
    tokens, its own variant id)."""
    out: dict[str, Any] = {
        "answer": ans.text, "citations": list(ans.citations),
        "cited_ids": list(ans.cited_ids), "context_ids": list(ans.context_ids),
        "latency_ms": {k: float(v) for k, v in ans.latency_ms.items()},
        "tokens_in": int(ans.tokens_in), "tokens_out": int(ans.tokens_out),
        "variant_id": ans.config_hash}
    out.update(override)
    return out


def add_scores(out: dict[str, Any], ans, gold: dict[str, Any], question: str,
               k: int) -> dict[str, Any]:
    """`out` (a replica's answer record) with `scores` and `gold_category` set for the
    `rag.types.Answer` `ans` to `question`: SCORE_KEYS (those the answer has) and the example's
    category when the question is one of the served dataset's own (`gold`, by normalised
    question; `k`: the config's k); else `scores` None, `gold_category` None and
    `signal_input` (`signal_input(ans)`), from which `score_signals` gives SIGNAL_KEYS later,
    off the request path."""
    from rag.metrics import score_answer

    ex = gold.get(normalise_question(question))
    if ex is not None:
        s = score_answer(ans, ex, k=k)
        out["scores"] = {key: float(s[key]) for key in SCORE_KEYS if key in s}
        out["gold_category"] = ex.category
        return out
    out["scores"] = None
    out["gold_category"] = None
    out["signal_input"] = signal_input(ans)
    return out


def signal_input(ans) -> dict[str, Any]:
    """What the signals read of the `rag.types.Answer` `ans`, as JSON: question, answer text,
    citations (1-based) and every context's id, title and text (AnswerSignals picks the cited
    ones itself), so `score_signals` scores exactly what `AnswerSignals.score(ans)` would."""
    return {"question": ans.question, "text": ans.text, "citations": list(ans.citations),
            "contexts": [{"id": c.id, "title": c.title, "text": c.text} for c in ans.contexts]}


def score_signals(payload: dict[str, Any]) -> dict[str, Any]:
    """SIGNAL_KEYS of the answer described by `payload` (`signal_input`), each in [0, 1] (0 for
    an abstention), with this process's `answer_signals()`: `{"scores": {key: value}, "ms":
    time spent scoring, ms}`. A payload without those fields raises ConfigError naming
    `signal_input.<field>`."""
    from rag.types import Answer, Context

    for key in ("question", "text", "citations", "contexts"):
        if key not in payload:
            raise ConfigError(f"signal_input.{key}", "missing")
    t0 = time.perf_counter()
    ans = Answer(query_id="signals", question=str(payload["question"]),
                 text=str(payload["text"]), citations=tuple(int(i) for i in payload["citations"]),
                 contexts=tuple(Context(str(c["id"]), str(c["title"]), str(c["text"]))
                                for c in payload["contexts"]),
                 candidates=(), latency_ms={}, tokens_in=0, tokens_out=0, config_hash="")
    sig = answer_signals().score(ans)
    return {"scores": {key: float(sig[key]) for key in SIGNAL_KEYS},
            "ms": (time.perf_counter() - t0) * 1000.0}


def deployment_options(num_cpus: float, max_ongoing_requests: int, num_replicas: int | None,
                       autoscaling: dict[str, Any] | None) -> dict[str, Any]:
    """`.options(...)` of the shared pipeline deployment from the `pipelines:` settings: a
    fixed `num_replicas`, else Serve's `autoscaling_config` (min/max replicas, target ongoing
    requests per replica, delays)."""
    opts: dict[str, Any] = {"ray_actor_options": {"num_cpus": num_cpus},
                            "max_ongoing_requests": max_ongoing_requests}
    if num_replicas is not None or not autoscaling:
        opts["num_replicas"] = num_replicas or 1
    else:
        opts["autoscaling_config"] = dict(autoscaling)
    return opts
