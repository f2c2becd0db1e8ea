"""Dataset hygiene: deduplication, a leakage report, and stratified split manifests.

Split manifests (`configs/splits/<name>.json`) are made once with a fixed seed and committed:
train feeds learners, valid is what tuners optimise on, test only reports.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rag.errors import ConfigError, DataError
from rag.metrics.qa import normalize_answer
from rag.resources import default_config
from rag.types import Example, Passage

SPLITS_DIR = default_config("splits")
"""The committed split manifests (shipped with the code, `rag.resources`)."""


def dedupe(passages: Iterable[Passage]) -> tuple[list[Passage], list[tuple[str, str]]]:
    """Keep the first passage of each normalised (title, text); returns (kept, [(dropped id,
    kept id)])."""
    seen: dict[str, str] = {}
    kept, dropped = [], []
    for p in passages:
        key = hashlib.sha1(f"{normalize_answer(p.title)}\x1f{normalize_answer(p.text)}"
                           .encode()).hexdigest()
        if key in seen:
            dropped.append((p.id, seen[key]))
        else:
            seen[key] = p.id
            kept.append(p)
    return kept, dropped


def leakage_report(examples: Sequence[Example], passages: Iterable[Passage],
                   max_examples: int = 20) -> dict:
    """Where gold answers occur verbatim (normalised, on word boundaries) in the corpus.

    `in_gold` counts answers found in their own gold passages (expected), `in_non_gold` in other
    passages (the answer is retrievable from elsewhere: not a leak of labels, but a caveat for
    citation metrics). yes/no answers are skipped."""
    texts = {p.id: " " + normalize_answer(f"{p.title} {p.text}") + " " for p in passages}
    rep = {"checked": 0, "in_gold": 0, "in_non_gold": 0, "not_found": 0, "examples": []}
    for e in examples:
        answers = [normalize_answer(a) for a in e.answers]
        answers = [a for a in answers if a and a not in ("yes", "no", "noanswer")]
        if not answers:
            continue
        rep["checked"] += 1
        gold = set(e.gold_passage_ids)
        hit_gold = any(f" {a} " in texts.get(g, "") for a in answers for g in gold)
        others = [pid for pid, t in texts.items() if pid not in gold
                  and any(f" {a} " in t for a in answers)]
        rep["in_gold"] += hit_gold
        rep["in_non_gold"] += bool(others)
        rep["not_found"] += not hit_gold and not others
        if others and len(rep["examples"]) < max_examples:
            rep["examples"].append({"id": e.id, "answer": e.answers[0], "passages": others[:5]})
    return rep


@dataclass(frozen=True)
class SplitManifest:
    name: str
    seed: int
    source_sha256: dict[str, str]
    splits: dict[str, list[str]] = field(default_factory=dict)
    stratified_by: str = "category"

    def ids(self, split: str) -> list[str]:
        if split not in self.splits:
            raise ConfigError("split", f"unknown split {split!r} (have: "
                                       f"{', '.join(self.splits)})")
        return list(self.splits[split])

    def check_disjoint(self) -> None:
        seen: dict[str, str] = {}
        for s, ids in self.splits.items():
            for i in ids:
                if i in seen:
                    raise DataError(self.name, f"id {i} is in both {seen[i]} and {s}")
                seen[i] = s

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"name": self.name, "seed": self.seed,
                                          "source_sha256": self.source_sha256,
                                          "stratified_by": self.stratified_by,
                                          "counts": {k: len(v) for k, v in self.splits.items()},
                                          "splits": self.splits}, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> SplitManifest:
        p = Path(path)
        if not p.exists():
            raise DataError(str(p), "split manifest does not exist")
        d = json.loads(p.read_text())
        return cls(d["name"], d["seed"], d["source_sha256"], d["splits"], d["stratified_by"])


def stratified_split(examples: Sequence[Example], sizes: dict[str, float | int], seed: int,
                     name: str, source_sha256: dict[str, str] | None = None) -> SplitManifest:
    """Split by category keeping each category's share in every split. `sizes` are counts
    (summing to at most len(examples)) or fractions (summing to 1)."""
    n = len(examples)
    total = sum(sizes.values())
    counts = {k: round(v * n) if total <= 1.0 + 1e-9 else int(v) for k, v in sizes.items()}
    if sum(counts.values()) > n:
        raise ConfigError("sizes", f"ask for {sum(counts.values())} examples, have {n}")
    by_cat: dict[str, list[str]] = defaultdict(list)
    for e in sorted(examples, key=lambda e: e.id):
        by_cat[e.category].append(e.id)
    rng = random.Random(seed)
    for ids in by_cat.values():
        rng.shuffle(ids)
    # interleave categories proportionally, then cut the sequence into the splits
    order: list[str] = []
    cats = sorted(by_cat)
    pos = {c: 0 for c in cats}
    while len(order) < n:
        c = min((c for c in cats if pos[c] < len(by_cat[c])),
                key=lambda c: ((pos[c] + 0.5) / len(by_cat[c]), c))
        order.append(by_cat[c][pos[c]])
        pos[c] += 1
    splits, start = {}, 0
    for k, c in counts.items():
        splits[k] = sorted(order[start:start + c])
        start += c
    m = SplitManifest(name, seed, source_sha256 or {}, splits)
    m.check_disjoint()
    return m


def load_split(name: str) -> SplitManifest:
    """The committed manifest configs/splits/<name>.json."""
    if not re.fullmatch(r"[\w\-]+", name):
        raise ConfigError("split", f"bad split name {name!r}")
    return SplitManifest.load(SPLITS_DIR / f"{name}.json")
