"""Graph retriever (HippoRAG-style): an entity graph over passages, walked with personalised
PageRank seeded by lexical/dense hits and by entities named in the query.

Graph: a bipartite passage x entity incidence matrix. Entities are passage titles plus
capitalised names found in the text (deterministic regex, no model); an entity links passages
that mention it, so "A mentions B's title" becomes a two-step path A -> entity B -> passage B,
the bridge a multi-hop question needs. Entities in a single passage (no edges) or in more than
`max_df` of the corpus (no information) are dropped.

Walk: x <- (1 - d) * seed + d * x P_pe P_ep, with P_pe (passage -> entity) and P_ep (entity ->
passage) row-normalised, damping d = probability of following an edge; power iteration to
tol 1e-6 or 50 steps. Scores are the final passage masses (they sum to 1).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from rag.corpus import Corpus
from rag.errors import ConfigError
from rag.fusion import normalise
from rag.index.base import Retriever, check_top_n
from rag.types import Hit

_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][\w'\-]+(?:\s+(?:of|the|de|von|van|and)?\s*"
                   r"[A-Z][\w'\-]+)*|\b[A-Z][\w'\-]+(?:\s+[A-Z][\w'\-]+)+")
_SKIP = {"the", "a", "an", "he", "she", "it", "they", "his", "her", "its", "this", "that",
         "in", "on", "at", "after", "before", "during", "from", "for", "with", "by", "as",
         "there", "these", "those", "when", "while", "however", "although", "january",
         "february", "march", "april", "may", "june", "july", "august", "september", "october",
         "november", "december"}


def norm_entity(s: str) -> str:
    return " ".join(s.lower().split())


def extract_entities(text: str) -> set[str]:
    out = set()
    for m in _NAME.finditer(text):
        e = norm_entity(m.group(0))
        if len(e) > 2 and e not in _SKIP:
            out.add(e)
    return out


class GraphRetriever(Retriever):
    kind = "graph"

    def __init__(self, incidence: sp.csr_matrix, ids: list[str], entities: list[str],
                 seeds: Sequence[Retriever] = (), damping: float = 0.5, n_seeds: int = 5):
        self.B = incidence.tocsr().astype(np.float64)
        self.ids = ids
        self.entities = entities
        self.entity_index = {e: i for i, e in enumerate(entities)}
        self.seeds = list(seeds)
        self.damping = damping
        self.n_seeds = n_seeds
        deg_p = np.asarray(self.B.sum(axis=1)).ravel()
        deg_e = np.asarray(self.B.sum(axis=0)).ravel()
        self.P_pe = sp.diags(1.0 / np.maximum(deg_p, 1e-12)) @ self.B
        self.P_ep = (sp.diags(1.0 / np.maximum(deg_e, 1e-12)) @ self.B.T).tocsr()
        self.dangling = deg_p == 0
        self._row = {pid: i for i, pid in enumerate(ids)}
        self._max_words = max((len(e.split()) for e in entities), default=1)

    # ---- build / persist --------------------------------------------------------------
    @classmethod
    def build(cls, corpus: Corpus, directory: str | Path | None = None, max_df: float = 0.02,
              seeds: Sequence[Retriever] = ()) -> GraphRetriever:
        titles = {norm_entity(p.title) for p in corpus if p.title}
        per_passage = []
        for p in corpus:
            ents = extract_entities(p.text)
            if p.title:
                ents.add(norm_entity(p.title))
            per_passage.append(ents)
        df = Counter(e for ents in per_passage for e in ents)
        limit = max(int(max_df * len(corpus)), 5)
        vocab = sorted(e for e, c in df.items() if 2 <= c <= limit or (e in titles and c >= 2))
        index = {e: i for i, e in enumerate(vocab)}
        rows, cols, vals = [], [], []
        for r, (p, ents) in enumerate(zip(corpus, per_passage, strict=True)):
            own = norm_entity(p.title) if p.title else None
            for e in ents:
                if e in index:
                    rows.append(r)
                    cols.append(index[e])
                    vals.append(2.0 if e == own else 1.0)
        B = sp.csr_matrix((vals, (rows, cols)), shape=(len(corpus), len(vocab)))
        g = cls(B, corpus.ids, vocab, seeds=seeds)
        if directory:
            g.save(directory)
        return g

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        sp.save_npz(d / "incidence.npz", self.B)
        (d / "graph.json").write_text(json.dumps({"ids": self.ids, "entities": self.entities}))

    @classmethod
    def load(cls, directory: str | Path, seeds: Sequence[Retriever] = ()) -> GraphRetriever:
        d = Path(directory)
        if not (d / "graph.json").exists():
            raise ConfigError("graph", f"{d} holds no graph index (graph.json missing)")
        meta = json.loads((d / "graph.json").read_text())
        return cls(sp.load_npz(d / "incidence.npz"), meta["ids"], meta["entities"], seeds=seeds)

    def with_seeds(self, seeds: Sequence[Retriever]) -> GraphRetriever:
        """This graph seeded by `seeds` instead: a shallow copy sharing the incidence and
        transition matrices (nothing is recomputed)."""
        g = copy.copy(self)
        g.seeds = list(seeds)
        return g

    @property
    def n_edges(self) -> int:
        return int(self.B.nnz)

    # ---- search ---------------------------------------------------------------------------
    def query_entities(self, query: str) -> list[int]:
        """Entities named in the query (n-gram lookup up to the longest entity)."""
        words = norm_entity(re.sub(r"[^\w'\- ]", " ", query)).split()
        found = []
        for n in range(min(self._max_words, 6), 0, -1):
            for i in range(len(words) - n + 1):
                e = " ".join(words[i:i + n])
                if e in self.entity_index and e not in _SKIP:
                    found.append(self.entity_index[e])
        return found

    def seed_vector(self, query: str, n_seeds: int) -> np.ndarray:
        s = np.zeros(len(self.ids))
        for r in self.seeds:
            hits = r.search(query, n_seeds)
            if hits:
                for h, v in zip(hits, normalise([h.score for h in hits]) + 0.1, strict=True):
                    s[self._row[h.id]] += v
        for e in self.query_entities(query):
            col = self.P_ep[e]
            s[col.indices] += 0.5 * col.data
        if s.sum() == 0:
            return s
        return s / s.sum()

    def ppr(self, seed: np.ndarray, damping: float, tol: float = 1e-6,
            max_iter: int = 50) -> np.ndarray:
        x = seed.copy()
        for _ in range(max_iter):
            walk = (self.P_pe.T @ x)          # passage mass -> entities
            walk = self.P_ep.T @ walk         # entities -> passages
            walk += x[self.dangling].sum() * seed  # passages without edges restart
            nxt = (1 - damping) * seed + damping * walk
            if np.abs(nxt - x).sum() < tol:
                return nxt
            x = nxt
        return x

    def search(self, query: str, top_n: int = 10, damping: float | None = None,
               n_seeds: int | None = None) -> list[Hit]:
        top_n = check_top_n(top_n)
        if not isinstance(query, str) or not query.strip():
            raise ConfigError("query", "must be a non-empty string")
        d = self.damping if damping is None else damping
        if not 0.0 < d < 1.0:
            raise ConfigError("graph_damping", f"must be in (0, 1), got {d}")
        seed = self.seed_vector(query, n_seeds or self.n_seeds)
        if seed.sum() == 0:
            return []
        mass = self.ppr(seed, d)
        n = min(top_n, int((mass > 0).sum()))
        top = np.argpartition(-mass, n - 1)[:n]
        hits = [Hit(float(mass[i]), self.ids[i]) for i in top]
        hits.sort(key=lambda h: (-h.score, h.id))
        return hits
