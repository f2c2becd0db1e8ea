"""Training pairs for the cross-encoder reranker, mined from real supervision.

Why this shape: a quick trial on synthetic pairs made MRR worse, so every positive here is a
labelled gold passage (SciFact train qrels, HotpotQA supporting paragraphs, MTRAG gold contexts)
and the negatives are what the reranker will actually have to push down at serving time: the
highest-scoring non-gold candidates of the project's own retrieval (hybrid or BM25). Random
corpus passages are kept as a second, easier pool for the later curriculum phase.

Only the train split of a dataset's committed manifest (configs/splits/*.json) may feed
training; `mine_items` refuses valid/test ids so no evaluation query ever leaks in.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rag.errors import ConfigError, DataError
from rag.types import Example, Hit, Passage

TRAIN_SPLITS = ("train",)
"""The only manifest splits training may read (valid tunes, test reports)."""


def passage_text(p: Passage) -> str:
    """The passage side of a pair, exactly as `rag.rerank.CrossEncoderReranker` formats it."""
    return f"{p.title}. {p.text}" if p.title else p.text


@dataclass(frozen=True)
class TrainItem:
    """One (query, gold passage) with its negative pools.

    `hard`: non-gold retrieval candidates, best first (the curriculum's first phase draws
    from the head of this list); `easy`: random corpus passages (second phase)."""

    source: str
    query_id: str
    query: str
    positive: str
    hard: tuple[str, ...]
    easy: tuple[str, ...]


def mine_items(source: str, examples: Sequence[Example], corpus, split_ids: Iterable[str],
               retrieve: Callable[[str], list[Hit]], *, n_hard: int = 10, n_easy: int = 10,
               max_queries: int | None = None, seed: int = 0) -> list[TrainItem]:
    """One item per (train query, gold passage). `split_ids` are the train ids of the split
    manifest: an example outside them raises DataError (a valid/test query must never train).
    `retrieve(question)` returns candidates best first; gold passages are removed from them."""
    allowed = set(split_ids)
    leaked = [e.id for e in examples if e.id not in allowed]
    if leaked:
        raise DataError(source, f"{len(leaked)} examples are not in the train split "
                                f"(e.g. {leaked[0]!r}): never train on valid/test queries")
    rng = random.Random(f"{seed}:{source}")
    all_ids = [p.id for p in corpus]
    chosen = [e for e in examples if e.gold_passage_ids]
    if max_queries is not None:
        chosen = rng.sample(chosen, min(max_queries, len(chosen)))
    items: list[TrainItem] = []
    for e in chosen:
        gold = set(e.gold_passage_ids)
        hard_ids = [h.id for h in retrieve(e.question) if h.id not in gold][:n_hard]
        easy_ids: list[str] = []
        while len(easy_ids) < n_easy and len(all_ids) > len(gold) + len(easy_ids):
            pid = rng.choice(all_ids)
            if pid not in gold and pid not in easy_ids:
                easy_ids.append(pid)
        hard = tuple(passage_text(corpus[i]) for i in hard_ids)
        easy = tuple(passage_text(corpus[i]) for i in easy_ids)
        for g in e.gold_passage_ids:
            if g in corpus:
                items.append(TrainItem(source, e.id, e.question, passage_text(corpus[g]),
                                       hard, easy))
    return items


def save_items(items: Sequence[TrainItem], path: str | Path) -> str:
    """Write JSONL; returns its sha256 (the manifest's data hash)."""
    text = "".join(json.dumps(asdict(i), ensure_ascii=False, sort_keys=True) + "\n"
                   for i in items)
    Path(path).write_text(text, encoding="utf-8")
    return hashlib.sha256(text.encode()).hexdigest()


def load_items(path: str | Path) -> list[TrainItem]:
    out = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                d = json.loads(line)
                out.append(TrainItem(d["source"], d["query_id"], d["query"], d["positive"],
                                     tuple(d["hard"]), tuple(d["easy"])))
            except (json.JSONDecodeError, KeyError) as exc:
                raise DataError(str(path), f"bad training item: {exc}", line=n) from None
    return out


def items_hash(items: Sequence[TrainItem]) -> str:
    h = hashlib.sha256()
    for i in items:
        h.update(json.dumps(asdict(i), sort_keys=True).encode())
    return h.hexdigest()


def mine_from_dataset(name: str, split: str, retriever: str, depth: int, n_hard: int,
                      n_easy: int, max_queries: int | None, seed: int,
                      info: dict | None = None) -> list[TrainItem]:
    """Mine `name`'s `split` (must be a train split) with the project's own retrieval over the
    dataset's cached indexes (`rl.common.data.TuningData`: corpus, indexes, split manifest).
    `info`, when given, receives the dataset manifest (`info["manifest"]`) for provenance."""
    from rag.config import RAGConfig
    from rag.pipeline import Pipeline
    from rl.common.data import TuningData

    if split not in TRAIN_SPLITS:
        raise ConfigError(f"reranker.data.sources.{name}.split",
                          f"{split!r} is not a training split (allowed: {TRAIN_SPLITS})")
    data = TuningData.open(name)
    if info is not None:
        info["manifest"] = data.dataset.manifest_dict()
    examples = split_examples(data, split)
    pipe = Pipeline(data.indexes, RAGConfig(variant=retriever, n_candidates=depth, k=1))
    return mine_items(name, examples, data.indexes.corpus, [e.id for e in examples],
                      pipe.candidates, n_hard=n_hard, n_easy=n_easy, max_queries=max_queries,
                      seed=seed)


def split_examples(data, split: str) -> list[Example]:
    """Examples of `split` from the committed manifest. SciFact's train queries live in
    qrels/train.tsv (the default loader reads test.tsv), so they are loaded from there."""
    from rag.corpus.hygiene import load_split

    if data.name == "scifact" and split not in data.splits:
        from rag.corpus.loaders import data_root, load_beir

        ids = set(load_split("scifact").ids(split))
        return [e for e in load_beir(data_root() / "scifact", split=split).examples
                if e.id in ids]
    return data.examples(split)
