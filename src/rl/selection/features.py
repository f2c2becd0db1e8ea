"""Candidate pools and the features a selection policy sees.

A `Pool` is everything about one query that does not change during an episode: the top-K
candidates (from the memoised retrieval lists of `rl.common.memo`, so nothing is re-retrieved), their
per-retriever ranks and scores, the rerank score, position, length, title/query overlap, the
passage embeddings and the query embedding (memoised too). `observe()` adds what depends on the
passages selected so far: novelty (1 - max cosine to the selected set), mean similarity, bridge
signals (candidate title mentioned in a selected passage, a selected title mentioned in the
candidate) and the query coverage the candidate would add.

Observation (a gymnasium Dict, fixed shapes so RLlib can batch it):
    cand         (K, CAND_DIM)  static + dynamic features of each candidate (zeros for padding)
    glob         (GLOB_DIM,)    query embedding, mean embedding of the selected passages,
                                episode progress and selected-set statistics
    action_mask  (K + 1,)       1 = a remaining candidate (or, last slot, stop) may be chosen
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rag.fusion import fuse_scores, normalise
from rag.types import Example, Hit

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_STOP = frozenset(["a", "an", "the", "of", "in", "on", "at", "to", "for", "from", "by", "with", "and", "or", "is", "are", "was", "were", "be", "been", "do", "does", "did", "what", "which", "who", "whom", "whose", "when", "where", "why", "how", "that", "this", "these", "those", "it", "its", "as", "into", "than", "then", "there", "their", "they", "he", "she", "his", "her", "both", "same", "either", "one", "name", "named", "called", "also", "has", "have", "had", "not", "no", "yes"])
PER_RETRIEVER = ("present", "score", "rr")
STATIC_NAMES = tuple(f"{r}_{f}" for r in ("bm25", "dense", "graph", "hybrid")
                     for f in PER_RETRIEVER) + (
    "rerank_cos", "rerank_norm", "rerank_rr", "cross_encoder", "position", "log_length",
    "title_query_overlap", "query_coverage")
DYNAMIC_NAMES = ("novelty", "mean_sim_selected", "title_in_selected", "selected_title_in_text",
                 "coverage_gain", "n_selected_frac")
CAND_NAMES = STATIC_NAMES + DYNAMIC_NAMES
CAND_DIM = len(CAND_NAMES)
GLOB_STATS = ("progress", "selected_frac", "coverage", "mean_rel_selected",
              "max_sim_within_selected", "pool_mean_rel", "any_selected")
GRAPH_KW = {"damping": 0.5, "n_seeds": 5}  # RAGConfig defaults: shares the tuner's memo rows
DEPTH = 100


def words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def content(text: str) -> set[str]:
    return {w for w in words(text) if w not in _STOP}


@dataclass
class Pool:
    """One query's candidate set (module docstring). Index i refers to candidate i."""

    qid: str
    query: str
    example: Example
    ids: list[str]
    titles: list[str]
    texts: list[str]
    static: np.ndarray            # (n, len(STATIC_NAMES))
    emb: np.ndarray               # (n, d) unit vectors
    qemb: np.ndarray              # (d,)
    rel: np.ndarray               # (n,) cosine(query, passage)
    rerank_order: list[int]       # the baseline's order (reranker, else candidate order)
    gold: frozenset[int] = frozenset()
    qwords: set[str] = field(default_factory=set)
    title_words: list[set[str]] = field(default_factory=list)
    text_words: list[set[str]] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def question(self) -> str:
        """The question the reader answers (the current turn; `query` may be rewritten)."""
        return self.example.question

    def gold_ids(self) -> set[str]:
        return set(self.example.gold_passage_ids)


def _per_retriever(hits: Sequence[Hit]) -> dict[str, tuple[float, float]]:
    """id -> (min-max score within the list, 1 / (1 + rank))."""
    norm = normalise([h.score for h in hits], "minmax") if hits else np.zeros(0)
    return {h.id: (float(s), 1.0 / (1.0 + r)) for r, (h, s) in enumerate(zip(hits, norm,
                                                                             strict=True))}


def retrieve_lists(memo, query: str, retrievers: Sequence[str], fusion_weight: float
                   ) -> dict[str, list[Hit]]:
    """Top-100 lists per retriever through the memoised retrievers (plus fused `hybrid`)."""
    lists: dict[str, list[Hit]] = {}
    if "bm25" in retrievers:
        lists["bm25"] = memo.bm25("tantivy").search(query, DEPTH)
    if "dense" in retrievers:
        lists["dense"] = memo.dense("flat").search(query, DEPTH)
    if "graph" in retrievers:
        lists["graph"] = memo.graph("tantivy", "flat").search(query, DEPTH, **GRAPH_KW)
    if "bm25" in lists and "dense" in lists:
        lists["hybrid"] = fuse_scores([lists["bm25"], lists["dense"]],
                                      [1.0 - fusion_weight, fusion_weight], "minmax",
                                      top_n=DEPTH)
    return lists


def build_pool(example: Example, query: str, lists: dict[str, list[Hit]], corpus, qemb,
               passage_embeddings, k: int, candidates_from: str, reranker: str = "cosine",
               ce_scores=None) -> Pool:
    """A Pool from retrieval lists. `passage_embeddings(ids)` -> unit vectors;
    `ce_scores(query, passages)` -> cross-encoder scores (only for reranker=cross_encoder)."""
    cand = [h.id for h in lists[candidates_from][:k]]
    n = len(cand)
    per = {r: _per_retriever(lists.get(r, [])) for r in ("bm25", "dense", "graph", "hybrid")}
    passages = [corpus[i] for i in cand]
    emb = np.asarray(passage_embeddings(cand), dtype=np.float32).reshape(n, -1)
    qemb = np.asarray(qemb, dtype=np.float32)
    rel = emb @ qemb if n else np.zeros(0, dtype=np.float32)
    ce = np.zeros(n)
    if reranker == "cross_encoder" and ce_scores is not None and n:
        ce = normalise(np.asarray(ce_scores(query, passages), dtype=np.float64), "minmax")
    if reranker == "cosine":
        order = sorted(range(n), key=lambda i: (-float(rel[i]), i))
    elif reranker == "cross_encoder":
        order = sorted(range(n), key=lambda i: (-float(ce[i]), i))
    else:
        order = list(range(n))
    rerank_rank = {c: r for r, c in enumerate(order)}
    rel_norm = normalise(rel, "minmax") if n else np.zeros(0)
    qw = content(query)
    title_w = [content(p.title) for p in passages]
    text_w = [content(f"{p.title} {p.text}") for p in passages]
    rows = []
    for i, pid in enumerate(cand):
        row: list[float] = []
        for r in ("bm25", "dense", "graph", "hybrid"):
            s, rr = per[r].get(pid, (0.0, 0.0))
            row += [1.0 if pid in per[r] else 0.0, s, rr]
        row += [float(rel[i]), float(rel_norm[i]), 1.0 / (1.0 + rerank_rank[i]), float(ce[i]),
                i / max(k, 1), math.log1p(len(passages[i].text.split())) / 6.0,
                len(title_w[i] & qw) / max(len(title_w[i]), 1),
                len(text_w[i] & qw) / max(len(qw), 1)]
        rows.append(row)
    static = np.asarray(rows, dtype=np.float32).reshape(n, len(STATIC_NAMES))
    gold_ids = set(example.gold_passage_ids)
    return Pool(example.id, query, example, cand, [p.title for p in passages],
                [p.text for p in passages], static, emb, qemb, rel.astype(np.float32), order,
                frozenset(i for i, pid in enumerate(cand) if pid in gold_ids), qw, title_w,
                text_w)


def glob_dim(emb_dim: int) -> int:
    return 2 * emb_dim + len(GLOB_STATS)


def observe(pool: Pool, selected: Sequence[int], k: int, max_steps: int,
            allow_stop: bool | None = None) -> dict[str, np.ndarray]:
    """The Dict observation (module docstring) after `selected` (candidate indices, in order)."""
    n, d = pool.n, pool.emb.shape[1]
    sel = list(selected)
    cand = np.zeros((k, CAND_DIM), dtype=np.float32)
    cand[:n, :len(STATIC_NAMES)] = pool.static
    covered: set[str] = set()
    for j in sel:
        covered |= pool.text_words[j]
    sel_text = set().union(*(pool.text_words[j] for j in sel)) if sel else set()
    sel_titles = [pool.title_words[j] for j in sel]
    if sel:
        sims = pool.emb @ pool.emb[sel].T  # (n, s)
        max_sim, mean_sim = sims.max(axis=1), sims.mean(axis=1)
    else:
        max_sim, mean_sim = np.zeros(n), np.zeros(n)
    qn = max(len(pool.qwords), 1)
    base = len(STATIC_NAMES)
    for i in range(n):
        tw = pool.title_words[i]
        cand[i, base:] = (
            1.0 - max_sim[i],
            mean_sim[i],
            len(tw & sel_text) / max(len(tw), 1) if sel else 0.0,
            max((len(t & pool.text_words[i]) / max(len(t), 1) for t in sel_titles),
                default=0.0),
            len((pool.text_words[i] & pool.qwords) - covered) / qn,
            len(sel) / max_steps,
        )
    glob = np.zeros(glob_dim(d), dtype=np.float32)
    glob[:d] = pool.qemb
    if sel:
        glob[d:2 * d] = pool.emb[sel].mean(axis=0)
        within = pool.emb[sel] @ pool.emb[sel].T
        off = within[~np.eye(len(sel), dtype=bool)]
        max_within = float(off.max()) if off.size else 0.0
    else:
        max_within = 0.0
    glob[2 * d:] = (len(sel) / max_steps, len(sel) / max(n, 1),
                    len(covered & pool.qwords) / qn,
                    float(pool.rel[sel].mean()) if sel else 0.0, max_within,
                    float(pool.rel.mean()) if n else 0.0, 1.0 if sel else 0.0)
    mask = np.zeros(k + 1, dtype=np.float32)
    mask[:n] = 1.0
    mask[sel] = 0.0
    can_stop = bool(sel) if allow_stop is None else allow_stop
    if len(sel) >= max_steps or not mask[:n].any():
        mask[:k] = 0.0
        can_stop = True
    mask[k] = 1.0 if can_stop else 0.0
    return {"cand": np.clip(cand, -10, 10), "glob": np.clip(glob, -10, 10), "action_mask": mask}
