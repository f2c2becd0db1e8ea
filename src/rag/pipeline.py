"""Pipeline: a RAGConfig applied to an IndexSet.

    query ─► candidates ─► (fuse) ─► (rerank) ─► select (top-k | MMR) ─► generate ─► Answer

`Pipeline.run` answers one question and times each stage (ms, wall clock on this process);
`run_batch` answers many, batching the generator and attributing each batch's time evenly to
its questions. Models and generators are shared between pipelines through `Resources`, so
evaluating many configs loads each model once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager

from rag.config import RAGConfig
from rag.errors import ConfigError
from rag.indexset import IndexSet
from rag.models import ModelRegistry, default_registry
from rag.types import Answer, Context, Generation, Hit

MAX_QUESTION_CHARS = 4000


class Resources:
    """Process-wide cache of loaded rerankers and generators, keyed by (name, device)."""

    def __init__(self, registry: ModelRegistry | None = None):
        self.registry = registry or default_registry()
        self._items: dict[tuple, object] = {}
        self._lock = threading.Lock()

    def _get(self, key: tuple, make: Callable[[], object]):
        with self._lock:
            if key not in self._items:
                self._items[key] = make()
            return self._items[key]

    def generator(self, name: str, device: str = "cpu"):
        from rag.generation.factory import make_generator

        return self._get(("gen", name, device),
                         lambda: make_generator(name, registry=self.registry, device=device))

    def reranker(self, kind: str, model: str, device: str = "cpu"):
        from rag.rerank import make_reranker

        return self._get(("rerank", kind, model, device),
                         lambda: make_reranker(kind, model, device=device, registry=self.registry))


def mix_with_retrieval_rank(scores, head: Sequence[Hit], weight: float) -> list[Hit]:
    """`head` (retrieval order) re-sorted by weight * minmax(scores) + (1 - weight) *
    minmax(-rank); ties broken by id. weight 1 = the reranker's order, 0 = retrieval order."""
    import numpy as np

    from rag.fusion import normalise

    s = np.asarray(scores, dtype=np.float64)
    mixed = weight * normalise(s) + (1.0 - weight) * normalise(-np.arange(len(head),
                                                                          dtype=np.float64))
    order = sorted(range(len(head)), key=lambda i: (-mixed[i], head[i].id))
    return [Hit(float(mixed[i]), head[i].id) for i in order]


def check_question(question: str) -> str:
    if not isinstance(question, str) or not question.strip():
        raise ConfigError("question", "must be a non-empty string")
    if len(question) > MAX_QUESTION_CHARS:
        raise ConfigError("question", f"is {len(question)} characters; the limit is "
                                      f"{MAX_QUESTION_CHARS}")
    return question.strip()


class Pipeline:
    """Answers questions over `indexes` with one `config`."""

    def __init__(self, indexes: IndexSet, config: RAGConfig | None = None,
                 resources: Resources | None = None):
        self.indexes = indexes
        self.config = config or RAGConfig()
        self.resources = resources or Resources()

    def with_config(self, config: RAGConfig) -> Pipeline:
        """Same indexes and loaded models, another config."""
        return Pipeline(self.indexes, config, self.resources)

    # ---- stages -----------------------------------------------------------------------------
    def candidates(self, question: str) -> list[Hit]:
        """Top-N candidates of the configured variant (fused for hybrid)."""
        from rag.fusion import fuse_scores

        c = self.config
        if c.variant == "bm25":
            return self.indexes.bm25(c.bm25_backend).search(question, c.n_candidates)
        if c.variant == "dense":
            return self.indexes.dense(c.dense_index).search(question, c.n_candidates)
        if c.variant == "graph":
            g = self.indexes.graph(c.bm25_backend, c.dense_index)
            return g.search(question, c.n_candidates, damping=c.graph_damping,
                            n_seeds=c.graph_seeds)
        sparse = self.indexes.bm25(c.bm25_backend).search(question, c.n_candidates)
        dense = self.indexes.dense(c.dense_index).search(question, c.n_candidates)
        return fuse_scores([sparse, dense], [1.0 - c.fusion_weight, c.fusion_weight],
                           method=c.normalisation, rrf_k=c.rrf_k, top_n=c.n_candidates)

    def rerank(self, question: str, hits: list[Hit]) -> list[Hit]:
        c = self.config
        if c.rerank == "none" or not hits:
            return hits
        head = hits[: c.rerank_depth]
        passages = [self.indexes.corpus[h.id] for h in head]
        if c.rerank == "cosine" and c.reranker_model == self.indexes.encoder_name:
            # same bi-encoder as the dense index: reuse its stored passage vectors
            from rag.rerank import CosineReranker

            dense = self.indexes.dense(c.dense_index)
            reranker = CosineReranker(dense.encoder, dense.passage_embeddings)
        else:
            reranker = self.resources.reranker(c.rerank, c.reranker_model, c.device)
        if c.rerank_mix is None:
            return reranker.rerank(question, passages)
        return mix_with_retrieval_rank(reranker.scores(question, passages), head, c.rerank_mix)

    def select(self, question: str, hits: list[Hit]) -> list[Hit]:
        """Top-k, or MMR re-selection when mmr_lambda < 1."""
        from rag.fusion import mmr_select

        c = self.config
        if c.mmr_lambda >= 1.0 or len(hits) <= c.k:
            return hits[: c.k]
        pool = hits[: max(c.k * 4, c.k)]
        dense = self.indexes.dense(c.dense_index)
        ids = [h.id for h in pool]
        chosen = mmr_select(dense.embed_query(question), ids, dense.passage_embeddings(ids),
                            [h.score for h in pool], c.k, c.mmr_lambda)
        by_id = {h.id: h for h in pool}
        return [by_id[i] for i in chosen]

    def contexts(self, hits: Sequence[Hit]) -> tuple[Context, ...]:
        corpus = self.indexes.corpus
        return tuple(Context(id=h.id, title=corpus[h.id].title, text=corpus[h.id].text,
                             score=float(h.score)) for h in hits)

    # ---- end to end ----------------------------------------------------------------------
    def retrieve(self, question: str) -> tuple[list[Hit], tuple[Context, ...], dict[str, float]]:
        """Everything before generation, with per-stage latency in ms."""
        lat: dict[str, float] = {}
        with _timed(lat, "retrieve"):
            cands = self.candidates(question)
        with _timed(lat, "rerank"):
            ranked = self.rerank(question, cands)
        with _timed(lat, "select"):
            chosen = self.select(question, ranked)
        return cands, self.contexts(chosen), lat

    def run(self, question: str, query_id: str = "q") -> Answer:
        question = check_question(question)
        cands, ctxs, lat = self.retrieve(question)
        gen = self.resources.generator(self.config.generator, self.config.device)
        with _timed(lat, "generate"):
            g = gen.generate(question, ctxs, self.config.prompt_id,
                             max_new_tokens=self.config.max_new_tokens,
                             temperature=self.config.temperature)
        return self._answer(query_id, question, cands, ctxs, lat, g)

    def run_batch(self, questions: Sequence[str], query_ids: Sequence[str] | None = None,
                  batch_size: int = 8, progress: Callable[[int], None] | None = None
                  ) -> list[Answer]:
        """Answer many questions; `progress(n_done)` is called after each generator batch."""
        qs = [check_question(q) for q in questions]
        ids = list(query_ids) if query_ids is not None else [str(i) for i in range(len(qs))]
        if len(ids) != len(qs):
            raise ConfigError("query_ids", "must have one id per question")
        gen = self.resources.generator(self.config.generator, self.config.device)
        out: list[Answer] = []
        for start in range(0, len(qs), batch_size):
            chunk = qs[start: start + batch_size]
            retrieved = [self.retrieve(q) for q in chunk]
            t0 = time.perf_counter()
            gens = gen.generate_batch(chunk, [r[1] for r in retrieved], self.config.prompt_id,
                                      max_new_tokens=self.config.max_new_tokens,
                                      temperature=self.config.temperature)
            per_q = (time.perf_counter() - t0) * 1000.0 / max(len(chunk), 1)
            for j, (q, (cands, ctxs, lat), g) in enumerate(zip(chunk, retrieved, gens,
                                                                strict=True)):
                lat["generate"] = per_q
                out.append(self._answer(ids[start + j], q, cands, ctxs, lat, g))
            if progress:
                progress(len(out))
        return out

    def _answer(self, qid: str, question: str, cands: list[Hit], ctxs: tuple[Context, ...],
                lat: dict[str, float], g: Generation) -> Answer:
        return Answer(query_id=qid, question=question, text=g.text, citations=g.citations,
                      contexts=ctxs, candidates=tuple(cands), latency_ms=dict(lat),
                      tokens_in=g.tokens_in, tokens_out=g.tokens_out,
                      config_hash=self.config.config_hash, raw=g.raw)


@contextmanager
def _timed(lat: dict[str, float], stage: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        lat[stage] = (time.perf_counter() - t0) * 1000.0
