"""Pipeline: a RAGConfig applied to an IndexSet.

    query ─► candidates ─► (fuse) ─► (rerank) ─► select (top-k | MMR) ─► (compress)
          ─► generate ─► Answer

`Pipeline.run` answers one question and times each stage (`STAGES`, ms) with a `StageTimer`
(wall clock on this process by default; the tuner passes `rl.common.memo.MemoStageTimer`, which
charges memoised retrievals their stored cost); `run_batch` answers many, batching the generator
and attributing each batch's time evenly to its questions. The stage order lives in one place,
`_retrieval_stages` + generation in `run_traced`: Serve, offline evaluation and the tuner all go
through it. Indexes are anything implementing `rag.index.provider.IndexProvider`. Models and
generators are shared between pipelines through `Resources`, so evaluating many configs loads
each model once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rag.config import RAGConfig
from rag.errors import ConfigError
from rag.index.provider import IndexProvider
from rag.models import ModelRegistry, default_registry
from rag.types import Answer, Context, Generation, Hit

MAX_QUESTION_CHARS = 4000
STAGES = ("retrieve", "rerank", "select", "generate")
"""The stages `run` times, in the order they run (keys of `Answer.latency_ms`)."""


class StageTimer:
    """Latency of each stage of one question, in ms (`latency_ms`, filled in stage order).

    `with timer.stage(name): ...` records the wall time of the block on this process. A
    subclass decides what else a stage costs (`rl.common.memo.MemoStageTimer` replaces the time
    spent in memo lookups by the stored cost of the retrievals they stand for). Use one timer
    per question."""

    def __init__(self) -> None:
        self.latency_ms: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.latency_ms[name] = (time.perf_counter() - t0) * 1000.0


@dataclass(frozen=True)
class StageTrace:
    """What each stage produced for one question: `candidates` (retrieval order, fused for
    hybrid: what `Answer.candidates` holds), `ranked` (after rerank; the candidates when rerank
    is off) and `chosen` (the k hits whose passages became the contexts)."""

    candidates: list[Hit]
    ranked: list[Hit]
    chosen: list[Hit]


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


def check_history(history: Any) -> None:
    """ConfigError `history` unless it is None or a sequence of {role, text} mappings with
    string text (a bare string or turns without text were accepted and answered)."""
    if history is None:
        return
    if isinstance(history, (str, bytes)) or not isinstance(history, Sequence) or not all(
            isinstance(t, Mapping) and isinstance(t.get("text"), str) for t in history):
        raise ConfigError("history", "must be a list of turns, each {role, text} with a string "
                                     "text")


class Pipeline:
    """Answers questions over `indexes` with one `config`."""

    def __init__(self, indexes: IndexProvider, config: RAGConfig | None = None,
                 resources: Resources | None = None):
        if indexes is None:
            raise ConfigError("indexes", "a Pipeline needs an IndexSet (or another "
                                         "IndexProvider)")
        if isinstance(config, Mapping):  # overrides, validated (errors name `rag.<key>`)
            config = RAGConfig.from_dict(dict(config))
        elif config is not None and not isinstance(config, RAGConfig):
            raise ConfigError("config", f"must be a RAGConfig or a mapping of its keys, got "
                                        f"{type(config).__name__}")
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

    def contexts(self, hits: Sequence[Hit], question: str | None = None
                 ) -> tuple[Context, ...]:
        """The passages of `hits` as the generator gets them: whole, or, when
        `config.context_budget` is set, each cut to its sentences that best cover `question`
        (`rag.generation.context.compress`; ValueError when `question` is None then)."""
        from rag.generation.context import compress

        corpus = self.indexes.corpus
        budget = self.config.context_budget
        if budget is not None and question is None:
            raise ValueError("context_budget is set: contexts() needs the question")

        def text(pid: str) -> str:
            t = corpus[pid].text
            return t if budget is None else compress(question, t, budget)

        return tuple(Context(id=h.id, title=corpus[h.id].title, text=text(h.id),
                             score=float(h.score)) for h in hits)

    # ---- end to end ----------------------------------------------------------------------
    def load_models(self) -> None:
        """Load the generator and reranker this config uses now (once per `Resources`), so no
        stage timing includes a model load."""
        c = self.config
        self.resources.generator(c.generator, c.device)
        if c.rerank != "none" and not (c.rerank == "cosine"
                                       and c.reranker_model == self.indexes.encoder_name):
            self.resources.reranker(c.rerank, c.reranker_model, c.device)

    def _retrieval_stages(self, question: str, timer: StageTimer
                          ) -> tuple[list[Hit], list[Hit], list[Hit]]:
        """retrieve -> rerank -> select, each timed by `timer`: (candidates, ranked, chosen)."""
        with timer.stage("retrieve"):
            cands = self.candidates(question)
        with timer.stage("rerank"):
            ranked = self.rerank(question, cands)
        with timer.stage("select"):
            chosen = self.select(question, ranked)
        return cands, ranked, chosen

    def retrieve(self, question: str, timer: StageTimer | None = None
                 ) -> tuple[list[Hit], tuple[Context, ...], dict[str, float]]:
        """Everything before generation: (candidates, contexts, per-stage latency in ms)."""
        timer = timer or StageTimer()
        cands, _, chosen = self._retrieval_stages(question, timer)
        return cands, self.contexts(chosen, question), timer.latency_ms

    def retrieval_query(self, question: str,
                        history: Sequence[Mapping[str, str]] | None = None) -> str:
        """What the retrieval stages search with: `question` (checked) after `history` (the
        earlier turns, `Example.history`) as `config.query_formulation` says
        (`rag.query_formulation`; None = the question alone)."""
        from rag.query_formulation import formulate_query

        check_history(history)
        return formulate_query(check_question(question), history,
                               self.config.query_formulation, max_chars=MAX_QUESTION_CHARS)

    def _gen_kwargs(self) -> dict[str, Any]:
        c = self.config
        kw: dict[str, Any] = {"max_new_tokens": c.max_new_tokens, "temperature": c.temperature}
        if c.abstain_threshold is not None:  # unset: backends written before it keep working
            kw["abstain_threshold"] = c.abstain_threshold
        return kw

    def run_traced(self, question: str, query_id: str = "q", timer: StageTimer | None = None,
                   history: Sequence[Mapping[str, str]] | None = None
                   ) -> tuple[Answer, StageTrace]:
        """`run`, and what each stage produced (`StageTrace`). `history`: the conversation's
        earlier turns; retrieval uses `retrieval_query(question, history)`, generation answers
        `question` itself."""
        question = check_question(question)
        query = self.retrieval_query(question, history)
        timer = timer or StageTimer()
        cands, ranked, chosen = self._retrieval_stages(query, timer)
        ctxs = self.contexts(chosen, question)
        gen = self.resources.generator(self.config.generator, self.config.device)
        with timer.stage("generate"):
            g = gen.generate(question, ctxs, self.config.prompt_id, **self._gen_kwargs())
        ans = self._answer(query_id, question, cands, ctxs, timer.latency_ms, g)
        return ans, StageTrace(cands, ranked, chosen)

    def run(self, question: str, query_id: str = "q", timer: StageTimer | None = None,
            history: Sequence[Mapping[str, str]] | None = None) -> Answer:
        """Answer one question (stripped; ConfigError when empty or over MAX_QUESTION_CHARS);
        `Answer.latency_ms` holds each of `STAGES` in ms as `timer` (default: wall clock)
        measured it. `history`: earlier turns of a conversation (see `run_traced`)."""
        return self.run_traced(question, query_id, timer, history)[0]

    def run_batch(self, questions: Sequence[str], query_ids: Sequence[str] | None = None,
                  batch_size: int = 8, progress: Callable[[int], None] | None = None
                  ) -> list[Answer]:
        """Answer many single-turn questions (no history: see `run` for conversations);
        `progress(n_done)` is called after each generator batch."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError("batch_size", f"must be a whole number >= 1, got {batch_size!r}")
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
                                      **self._gen_kwargs())
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

