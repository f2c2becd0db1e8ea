"""Dataset hygiene: deduplication, a leakage report, a gold-reachability report, and split
manifests.

Split manifests (`configs/splits/<name>.json`) are made once with a fixed seed and committed:
train feeds learners, valid is what tuners optimise on, test only reports. A manifest applies
to a dataset only when it was made from that dataset's content (`manifest_for`: the dataset's
source sha256s are among the manifest's), whatever name the dataset was loaded under; a user's
own file therefore never gets filtered by the project's id lists. `resolve_split` is the one
way a command picks the examples of a split (the CLI's `eval`, the tuner's `TuningData`).
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
from typing import TYPE_CHECKING

from rag.errors import ConfigError, DataError
from rag.metrics.qa import normalize_answer
from rag.resources import default_config
from rag.types import Example, Passage

if TYPE_CHECKING:
    from rag.corpus.loaders import Dataset
    from rag.corpus.store import Corpus

SPLITS_DIR = default_config("splits")
"""The committed split manifests (shipped with the code, `rag.resources`)."""
ALL = "all"
SPLIT_NAMES = ("train", "valid", "test")
"""The splits a manifest holds (committed or derived); `ALL` is every example."""
"""The split name that selects every example of a dataset."""
DERIVED_SPLIT_SIZES: dict[str, float | int] = {"valid": 0.5, "test": 0.5}
"""Split sizes for data without a committed manifest (the synthetic world, a user's own file)
where a caller derives splits (`split_manifest(..., derive=DERIVED_SPLIT_SIZES)`: the tuner)."""


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
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
            return cls(d["name"], d["seed"], d["source_sha256"], d["splits"],
                       d["stratified_by"])
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(str(p), f"split manifest is not JSON ({exc})") from None
        except (KeyError, TypeError) as exc:  # a list, or a key missing
            raise DataError(str(p), f"not a split manifest (name, seed, source_sha256, "
                                    f"splits, stratified_by): {exc!r}") from None


def stratified_split(examples: Sequence[Example], sizes: dict[str, float | int], seed: int,
                     name: str, source_sha256: dict[str, str] | None = None) -> SplitManifest:
    """Split by category keeping each category's share in every split. `sizes` are counts
    (summing to at most len(examples)) or fractions (summing to at most 1; any number of
    examples: the counts are apportioned by largest remainder, ties to the earlier split, so
    fractions summing to 1 place every example, e.g. 3 examples at 0.5/0.5 -> 2/1)."""
    n = len(examples)
    total = sum(sizes.values())
    if any(v < 0 for v in sizes.values()):
        raise ConfigError("sizes", f"must not be negative, got {dict(sizes)}")
    counts = (_apportion(sizes, n) if total <= 1.0 + 1e-9
              else {k: int(v) for k, v in sizes.items()})
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


def _apportion(fractions: dict[str, float | int], n: int) -> dict[str, int]:
    """Integer counts for `fractions` of n (largest remainder; the total is round(sum * n))."""
    target = min(n, round(sum(fractions.values()) * n))
    exact = {k: v * n for k, v in fractions.items()}
    counts = {k: int(x) for k, x in exact.items()}
    keys = list(fractions)
    by_rest = sorted(keys, key=lambda k: (-(exact[k] - counts[k]), keys.index(k)))
    for k in by_rest[:max(0, target - sum(counts.values()))]:
        counts[k] += 1
    return counts


def load_split(name: str) -> SplitManifest:
    """The committed manifest configs/splits/<name>.json."""
    if not re.fullmatch(r"[\w\-]+", name):
        raise ConfigError("split", f"bad split name {name!r}")
    return SplitManifest.load(SPLITS_DIR / f"{name}.json")


# ---- which manifest applies, and the examples of a split -------------------------------------
def _manifest_paths(first: str) -> list[Path]:
    paths = sorted(Path(SPLITS_DIR).glob("*.json"))
    return sorted(paths, key=lambda p: p.stem != first)


def manifest_for(dataset: Dataset) -> SplitManifest | None:
    """The committed manifest made from `dataset`'s content: the first whose recorded sha256s
    include every source file's sha256 (its own name's manifest is tried first), else None. A
    dataset with no source files (the generated synthetic world) has none."""
    shas = set(dataset.sources.values())
    if not shas:
        return None
    for path in _manifest_paths(dataset.name):
        m = SplitManifest.load(path)
        if shas <= set(m.source_sha256.values()):
            return m
    return None


def default_split(dataset: Dataset) -> str:
    """"test" for a dataset loaded by a built-in name that has a committed manifest; "all"
    otherwise (a dataset given by path is evaluated in full unless a split is asked for)."""
    return "test" if dataset.builtin and manifest_for(dataset) is not None else ALL


def _no_manifest(dataset: Dataset, split: str) -> DataError:
    committed = Path(SPLITS_DIR) / f"{dataset.name}.json"
    if dataset.builtin and committed.exists():
        made = SplitManifest.load(committed).source_sha256
        have = {Path(p).name: s[:12] for p, s in dataset.sources.items()}
        return DataError(str(committed), f"this split manifest was made from "
                         f"{ {k: v[:12] for k, v in made.items()} }, but {dataset.name}'s files "
                         f"now hash to {have}: restore the original files, or evaluate every "
                         f"example with --split all")
    asked = f" (asked for split {split!r})" if split else ""
    return DataError(dataset.name, f"no split manifest applies{asked}: the committed split "
                     f"manifests apply only to the datasets they were made from (matched by "
                     f"content sha256), and {dataset.name} is not one of them; evaluate every "
                     f"example with --split all")


def committed_manifest(dataset: Dataset) -> SplitManifest | None:
    """The committed manifest made from `dataset`'s content (`manifest_for`), or None for data
    no committed manifest was made from. A built-in dataset whose files no longer match its
    committed manifest is a DataError: a re-drawn split would mix test questions into tuning."""
    m = manifest_for(dataset)
    if m is None and dataset.builtin and (Path(SPLITS_DIR) / f"{dataset.name}.json").exists():
        raise _no_manifest(dataset, "")
    return m


def split_manifest(dataset: Dataset, *, seed: int = 13,
                   derive: dict[str, float | int] | None = None) -> SplitManifest:
    """The manifest that splits `dataset`: the committed one made from its content
    (`manifest_for`), else, when `derive` gives split sizes, a stratified split of its
    examples with `seed` (`stratified_split`; the tuner derives valid/test of own data so),
    else a DataError naming the dataset and suggesting `--split all`. A built-in dataset whose
    files no longer match its committed manifest is a DataError even with `derive` (a silently
    re-drawn split would mix the test set into tuning)."""
    m = committed_manifest(dataset)
    if m is not None:
        return m
    if derive:
        return stratified_split(dataset.examples, derive, seed, dataset.name,
                                {Path(p).name: s for p, s in dataset.sources.items()})
    raise _no_manifest(dataset, "")


def resolve_split(dataset: Dataset, split: str, *, seed: int = 13,
                  derive: dict[str, float | int] | None = None) -> list[Example]:
    """The examples of `split` ("all" = every example), in dataset order.

    Raises DataError when the dataset has no questions (a corpus-only file) or no manifest
    applies (see `split_manifest`), ConfigError when the manifest has no such split or the
    split selects no example of this dataset (naming the split and the counts)."""
    if not dataset.examples:
        raise DataError(dataset.name, f"has no questions ({len(dataset.corpus)} passages, 0 "
                        f"examples): a corpus-only file can be indexed but not evaluated; give "
                        f"a dataset with questions (a HotpotQA file or a BEIR folder)")
    if split == ALL:
        return list(dataset.examples)
    if split not in SPLIT_NAMES:  # a typo, not a manifest problem
        raise ConfigError("split", f"unknown split {split!r}: one of "
                                   f"{', '.join((*SPLIT_NAMES, ALL))}")
    if manifest_for(dataset) is None and not derive:
        raise _no_manifest(dataset, split)
    manifest = split_manifest(dataset, seed=seed, derive=derive)
    ids = set(manifest.ids(split))
    chosen = [e for e in dataset.examples if e.id in ids]
    if not chosen:
        raise ConfigError("split", f"split {split!r} of manifest {manifest.name!r} lists "
                          f"{len(ids)} ids, none of which is among the "
                          f"{len(dataset.examples)} examples of {dataset.name}; use --split all")
    return chosen


# ---- is the gold reachable? -------------------------------------------------------------------
def gold_report(examples: Sequence[Example], corpus: Corpus, max_ids: int = 10) -> dict:
    """How much of the examples' gold points into `corpus`.

    Counts: `labels` (gold passage ids and qrels with grade > 0), `labels_outside_corpus`
    (those naming no passage of the corpus) and the examples carrying one; `titles_missing`
    (HotpotQA supporting-fact titles with no passage of that title among the gold: absent from
    the record's context) and the examples carrying one; `no_reachable_gold`: examples with
    nothing to score retrieval against (labels, but none in the corpus; or no labels, no
    titles and no answers), with the first `max_ids` ids; `facts_outside_paragraph`
    (supporting facts whose sentence index is past the end of their paragraph: the sentence
    metrics could never credit them) and the examples carrying one."""
    rep = {"examples": len(examples), "labels": 0, "labels_outside_corpus": 0,
           "examples_with_labels_outside_corpus": 0, "titles_missing": 0,
           "examples_with_titles_missing": 0, "facts_outside_paragraph": 0,
           "examples_with_facts_outside_paragraph": 0, "no_reachable_gold": 0,
           "no_reachable_gold_ids": []}
    for e in examples:
        labels = set(e.gold_passage_ids) | {p for p, g in e.qrels.items() if g > 0}
        reachable = {p for p in labels if p in corpus}
        outside = len(labels) - len(reachable)
        titles = {corpus[p].title for p in reachable}
        missing = [t for t in e.gold_titles if t not in titles]
        sentences = {corpus[p].title: corpus[p].metadata.get("sentences") for p in reachable}
        past = sum(1 for t, i in e.supporting_facts
                   if isinstance(sentences.get(t), list) and not 0 <= i < len(sentences[t]))
        rep["facts_outside_paragraph"] += past
        rep["examples_with_facts_outside_paragraph"] += bool(past)
        rep["labels"] += len(labels)
        rep["labels_outside_corpus"] += outside
        rep["examples_with_labels_outside_corpus"] += bool(outside)
        rep["titles_missing"] += len(missing)
        rep["examples_with_titles_missing"] += bool(missing)
        if not reachable and (labels or e.gold_titles or not e.answers):
            rep["no_reachable_gold"] += 1
            if len(rep["no_reachable_gold_ids"]) < max_ids:
                rep["no_reachable_gold_ids"].append(e.id)
    return rep


def require_reachable_gold(rep: dict, where: str, override: str | None = None) -> None:
    """DataError when more than half of a `gold_report`'s examples have no reachable gold:
    their retrieval scores would be 0 by construction, so a score of that data would be a
    silent zero. `where` names the data (and split); `override` says how the caller accepts it
    anyway (a CLI flag, a request field; None: it cannot)."""
    if rep["no_reachable_gold"] * 2 > rep["examples"]:
        raise DataError(where, f"{rep['no_reachable_gold']} of {rep['examples']} questions have "
                        f"no reachable gold (labels outside the corpus, supporting facts missing "
                        f"from the context): the scores would be 0 by construction. Fix the "
                        f"data (see `ragpilot data-report`)"
                        + (f", or {override}" if override else ""))


def gold_warnings(rep: dict) -> list[str]:
    """One sentence per problem `gold_report` counted (empty when the gold is all reachable)."""
    out = []
    if rep["labels_outside_corpus"]:
        out.append(f"{rep['labels_outside_corpus']} of {rep['labels']} relevance labels (in "
                   f"{rep['examples_with_labels_outside_corpus']} examples) name documents "
                   f"absent from the corpus")
    if rep["titles_missing"]:
        out.append(f"{rep['titles_missing']} supporting-fact titles (in "
                   f"{rep['examples_with_titles_missing']} examples) are missing from the "
                   f"context")
    if rep.get("facts_outside_paragraph"):
        out.append(f"{rep['facts_outside_paragraph']} supporting facts (in "
                   f"{rep['examples_with_facts_outside_paragraph']} examples) point past the "
                   f"end of their paragraph")
    if rep["no_reachable_gold"]:
        out.append(f"{rep['no_reachable_gold']} of {rep['examples']} examples have no "
                   f"reachable gold (e.g. {', '.join(rep['no_reachable_gold_ids'][:3])}): "
                   f"their retrieval scores are 0 by construction")
    return out


def normalise_question(q: str) -> str:
    """Whitespace- and case-insensitive key of a question: how a served or logged question
    finds its gold (`gold_by_question`)."""
    return re.sub(r"\s+", " ", q.strip().lower())


def gold_by_question(examples: Iterable[Example]) -> dict[str, Example]:
    """`examples` keyed by `normalise_question`: the gold the Serve replicas score answers with
    and the promotion replay scores both arms with."""
    return {normalise_question(e.question): e for e in examples}
