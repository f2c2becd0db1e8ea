"""Pools for a dataset split, from the tuner's memoised retrieval (rl.common.memo, on disk under
<cache>/tuner): a question already retrieved by the tuner or an earlier run costs a table
lookup; a new one runs the real retrievers once and is stored for next time. Query embeddings
are memoised the same way; passage embeddings come from the dense index's stored vectors.

MTRAG questions are rewritten first (rl.selection.rewrite) and the rewrite is what retrieval and
the features see; the reader still answers the current question.
"""

from __future__ import annotations

import time
from pathlib import Path

from rag.errors import ConfigError
from rag.models import cache_dir
from rag.types import Example
from rl.common.data import TuningData
from rl.common.memo import MemoIndexSet
from rl.selection.config import SelectionConfig
from rl.selection.features import Pool, build_pool, retrieve_lists
from rl.selection.rewrite import QueryRewriter


def cross_encoder_status(name: str) -> tuple[str | None, str]:
    """(the model to load, "") when `name` is a registered cross-encoder
    (`rag.models.default_registry()`, which includes `ragpilot train-reranker`'s local registry)
    whose weights exist, or a local model folder; else (None, "not run: <why>")."""
    from rag.models import default_registry

    if name and (Path(name).expanduser() / "config.json").exists():
        return name, ""
    try:
        spec = default_registry().get(name)
    except Exception:  # noqa: BLE001 - unknown name / unreadable registry: not available
        return None, f"not run: no cross-encoder registered as {name!r} (train one: ragpilot " \
                     "train-reranker)"
    if spec.kind != "cross_encoder":
        return None, f"not run: no cross-encoder registered ({name!r} is a {spec.kind})"
    try:
        spec.resolve()
    except Exception as exc:  # noqa: BLE001 - registered, but its weights are gone
        return None, f"not run: cross-encoder {name!r} is registered but unusable ({exc})"
    return name, ""


def registered_cross_encoder(name: str) -> bool:
    """Whether `name` is a usable cross-encoder (cross_encoder_status)."""
    return cross_encoder_status(name)[0] is not None


class SelectionData:
    """A dataset's splits, memoised indexes and a pool builder."""

    def __init__(self, name: str, cfg: SelectionConfig, root: str | Path | None = None,
                 data: TuningData | None = None):
        self.name = name
        self.cfg = cfg
        self.data = data or TuningData.open(name)
        self.memo = MemoIndexSet(self.data.indexes, Path(root) if root else cache_dir() / "tuner")
        m = cfg.mtrag
        self.rewriter = QueryRewriter(m.rewrite, m.history_turns, m.generator)
        self._ce: dict = {}
        self.build_ms: list[float] = []

    def examples(self, split: str, limit: int | None = None) -> list[Example]:
        ex = self.data.examples(split)
        return ex[:limit] if limit else ex

    def _ce_scores(self, name: str):
        """`scores(query, passages)` of the cross-encoder `name` (loaded once per name)."""
        if name not in self._ce:
            model, why = cross_encoder_status(name)
            if model is None:
                raise ConfigError("selection.env.reranker_model", why.removeprefix("not run: "))
            from rag.rerank import make_reranker

            self._ce[name] = make_reranker("cross_encoder", model)
        return self._ce[name].scores

    def pool(self, example: Example, cfg: SelectionConfig | None = None) -> Pool:
        cfg = cfg or self.cfg
        e = cfg.env
        query = self.rewriter.rewrite(example) if example.history else example.question
        t0 = time.perf_counter()
        lists = retrieve_lists(self.memo, query, e.retrievers, e.fusion_weight)
        dense = self.memo.dense("flat")
        pool = build_pool(example, query, lists, self.data.indexes.corpus,
                          dense.embed_query(query), dense.passage_embeddings, e.k,
                          e.candidates_from, e.reranker,
                          self._ce_scores(e.reranker_model) if e.reranker == "cross_encoder"
                          else None)
        self.build_ms.append((time.perf_counter() - t0) * 1000.0)
        return pool

    def pools(self, split: str, limit: int | None = None,
              cfg: SelectionConfig | None = None) -> list[Pool]:
        out = [self.pool(x, cfg) for x in self.examples(split, limit)]
        self.memo.flush()
        return out

