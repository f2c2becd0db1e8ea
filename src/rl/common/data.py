"""The dataset bundle every learner and tuner opens: a dataset, its indexes and its named splits
(train feeds learners, valid is what tuners optimise, test only reports).

Where the splits come from (`split_manifest`):
  * `synthetic`: the world splits itself (seeded, valid/test halves);
  * a named dataset with a committed manifest (configs/splits/<name>.json): that manifest;
  * anything else the loaders read (a BEIR folder, a HotpotQA file, ...): a seeded stratified
    split into valid/test halves (`OWN_SPLIT_SEED`), keyed by the content hash of the data's
    source files (`content_hash`). It is looked for, in order, in the run directory
    (`<run_dir>/split.json`) and in the cache (`<cache>/splits/<name>-<hash>.json`), made when
    neither holds a manifest for this content, and then written to both: a run directory
    records the split it was tuned and reported on, and a later run on the same data (same
    bytes, any path) reuses it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from rag.corpus.loaders import Dataset, load_dataset
from rag.errors import ConfigError, DataError, RagError
from rag.indexset import IndexSet
from rag.models import cache_dir
from rag.types import Example

OWN_SPLIT_SEED = 13
"""Seed of the split made for data without a committed manifest."""
OWN_SPLIT_FILE = "split.json"
"""The split manifest's name in a run directory."""
GOLD_KINDS = ("answers", "qrels", "passages", "none")


@dataclass
class TuningData:
    """A dataset with its indexes and named splits (valid = tune on, test = holdout).
    `split_source`: "synthetic", "committed", "made" or "reused" (`split_manifest`);
    `split_path`: the manifest file read or written (None for synthetic)."""

    name: str
    dataset: Dataset
    indexes: IndexSet
    splits: dict[str, list[Example]]
    split_source: str = "committed"
    split_path: Path | None = None
    _gold: dict[str, dict] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def open(cls, name: str, root: str | Path | None = None,
             run_dir: str | Path | None = None) -> TuningData:
        """Load `name` (a dataset name or a path: `rag.corpus.loaders.load_dataset`), its
        splits (`split_manifest`; `run_dir`: where a split of data without a committed
        manifest is looked for and written), and open or build its indexes under `root`
        (default: <cache>/indexes/<dataset name>-<fingerprint>). A path's `name` is the
        loader's dataset name (what `policy.datasets` keys and tables use)."""
        ds = load_dataset(name)
        manifest, source, path = split_manifest(ds, name, run_dir)
        ds = with_manifest_qrels(ds, manifest)
        by_id = {e.id: e for e in ds.examples}
        splits = {s: [by_id[i] for i in ids if i in by_id] for s, ids in manifest.items()}
        splits = {s: ex for s, ex in splits.items() if ex}
        key = name if ds.builtin else ds.name  # the name asked for, or a path's loader name
        base = Path(root) if root else cache_dir() / "indexes"
        d = base / f"{key}-{ds.corpus.fingerprint()}"
        idx = IndexSet.open(d) if (d / "corpus.jsonl").exists() else IndexSet.create(
            ds.corpus, d, manifest=ds.manifest_dict())
        return cls(key, ds, idx, splits, source, path)

    def examples(self, split: str) -> list[Example]:
        if split not in self.splits:
            raise ConfigError("split", f"unknown split {split!r} for {self.name} (have: "
                                       f"{', '.join(sorted(self.splits))})")
        return self.splits[split]

    def gold_report(self, split: str) -> dict:
        """How much of `split`'s gold points into the corpus (`rag.corpus.hygiene.gold_report`:
        labels outside the corpus, supporting facts missing from the context, questions with
        nothing reachable), with its `warnings` (one sentence per problem; empty when all of it
        is reachable). Computed once per split."""
        from rag.corpus.hygiene import gold_report, gold_warnings

        if split not in self._gold:
            rep = gold_report(self.examples(split), self.dataset.corpus)
            self._gold[split] = {**rep, "warnings": gold_warnings(rep)}
        return self._gold[split]

    def gold_warnings(self, split: str) -> list[str]:
        """`gold_report(split)`'s warnings, each naming the dataset and the split: the lines
        the tuner's entry points print and their reports carry."""
        return [f"{self.name} ({split} split): {w}" for w in self.gold_report(split)["warnings"]]

    def check_gold(self, splits: Sequence[str], allow_missing: bool = False,
                   override: str | None = "pass --allow-missing-gold") -> dict[str, dict]:
        """`gold_report` of each split. More than half of a split's questions with no reachable
        gold is a DataError naming the dataset and split (every retrieval score of that split
        would be 0 by construction: `rag.corpus.hygiene.require_reachable_gold`) unless
        `allow_missing`; `override` is how the caller's user accepts such data anyway (None:
        they cannot)."""
        from rag.corpus.hygiene import require_reachable_gold

        reports = {s: self.gold_report(s) for s in dict.fromkeys(splits)}
        if not allow_missing:
            for s, rep in reports.items():
                require_reachable_gold(rep, f"{self.name} ({s} split)", override)
        return reports

    def gold_kind(self) -> str:
        """What gold the examples carry, the richest kind any example has: "answers" (QA),
        "qrels" (graded relevance: retrieval-only), "passages" (gold passage ids, no grades)
        or "none" (questions only). `DatasetSlice.for_gold` picks F and R from it."""
        ex = self.dataset.examples
        if any(e.answers for e in ex):
            return "answers"
        if any(e.qrels for e in ex):
            return "qrels"
        if any(e.gold_passage_ids for e in ex):
            return "passages"
        return "none"


def with_manifest_qrels(ds: Dataset, manifest: dict[str, list[str]]) -> Dataset:
    """`ds` with the examples of every qrels split of its BEIR folder that the manifest's ids
    need. A BEIR dataset loads one qrels file (`qrels/test.tsv`), but its committed manifest
    splits the queries judged in all of them (SciFact: 809 train ids live in `qrels/train.tsv`);
    without this those ids would find no example and the split would silently vanish. Data that
    is not a BEIR folder, or whose manifest ids are all present, comes back unchanged."""
    from dataclasses import replace

    from rag.corpus.loaders import load_beir

    have = {e.id for e in ds.examples}
    missing = {i for ids in manifest.values() for i in ids} - have
    qrels_files = [Path(p) for p in ds.sources if Path(p).parent.name == "qrels"]
    if not missing or not qrels_files:
        return ds
    folder = qrels_files[0].parent.parent
    loaded = {p.stem for p in qrels_files}
    extra: list[Example] = []
    for qrels in sorted(folder.glob("qrels/*.tsv")):
        if qrels.stem in loaded or not missing:
            continue
        for e in load_beir(folder, qrels.stem, name=ds.name).examples:
            if e.id in missing:
                extra.append(e)
                missing.discard(e.id)
    return replace(ds, examples=ds.examples + tuple(extra)) if extra else ds


def content_hash(ds: Dataset) -> str:
    """16 hex of sha256 over the sha256 of the dataset's source files (their bytes, not their
    paths) and the own-split recipe: equal for the same data wherever it lies."""
    h = hashlib.sha256(f"valid/test halves, seed {OWN_SPLIT_SEED}".encode())
    for digest in sorted(ds.sources.values()):
        h.update(digest.encode())
    return h.hexdigest()[:16]


def claim_directory(out: Path, marker: str, what: str, files: Sequence[str],
                    overwrite: bool) -> None:
    """Refuse to write a new run into `out` when it holds a finished one (its `marker` file):
    a ConfigError naming `out`, since its results would be mixed with the new run's or
    replaced under what points at them. `overwrite` removes `files` (file or directory names
    under `out`) and nothing else."""
    if not (out / marker).exists():
        return
    if not overwrite:
        raise ConfigError("out", f"{out} holds {what} ({marker}): choose another --out, or "
                                 "pass --overwrite to replace it")
    for name in files:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


@contextmanager
def run_directory(out: str | Path) -> Iterator[Path]:
    """`out`, made for a run (ConfigError naming `out` when it cannot be a directory), around
    the run's set-up (opening its data, checking its gold). When the body raises a RagError the
    run refused its input before it started, so the split manifest the set-up wrote to `out`
    goes (the cache keeps its own copy), and so does `out` itself when this made it and nothing
    else is in it. What was there before is kept."""
    out = Path(out)
    made_out, had_split = not out.exists(), (out / OWN_SPLIT_FILE).exists()
    try:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file there, or above it
            raise ConfigError("out", f"cannot create directory {out}: {exc.strerror}") from None
        yield out
    except RagError:
        if not had_split:
            with suppress(OSError):  # absent, or `out` is not a directory
                (out / OWN_SPLIT_FILE).unlink()
        if made_out:
            with suppress(OSError):  # absent, or not empty: something else is in it
                out.rmdir()
        raise


def split_manifest(ds: Dataset, name: str, run_dir: str | Path | None = None
                   ) -> tuple[dict[str, list[str]], str, Path | None]:
    """(split name -> example ids, where it came from, the manifest file) for dataset `ds`
    opened as `name` (see the module docstring for the order)."""
    from rag.corpus.hygiene import SPLITS_DIR, SplitManifest, committed_manifest, stratified_split

    if name == "synthetic":
        m = stratified_split(ds.examples, {"valid": 0.5, "test": 0.5}, seed=13, name=name)
        return m.splits, "synthetic", None
    committed = committed_manifest(ds)  # only the one made from this very content
    if committed is not None:
        return committed.splits, "committed", SPLITS_DIR / f"{committed.name}.json"
    if len(ds.examples) < 2:
        raise DataError(name, f"{len(ds.examples)} question(s) with gold: tuning needs at "
                              "least 2 (a valid and a test half)")
    digest = content_hash(ds)
    cached = cache_dir() / "splits" / f"{_safe(ds.name)}-{digest}.json"
    here = Path(run_dir) / OWN_SPLIT_FILE if run_dir is not None else None
    manifest, source = None, "reused"
    for cand in (here, cached):
        if cand is not None and cand.exists():
            m = SplitManifest.load(cand)
            if m.source_sha256.get("content") == digest:
                manifest = m
                break
    if manifest is None:
        n = len(ds.examples)
        # counts, not fractions: halves of an odd count cannot both round up past n
        manifest = stratified_split(ds.examples, {"valid": n - n // 2, "test": n // 2},
                                    seed=OWN_SPLIT_SEED, name=ds.name,
                                    source_sha256={"content": digest, **ds.sources})
        source = "made"
    for dest in (cached, here):
        if dest is not None and not _same(dest, manifest):
            dest.parent.mkdir(parents=True, exist_ok=True)
            manifest.save(dest)
    return manifest.splits, source, here or cached


def _safe(name: str) -> str:
    return re.sub(r"[^\w\-]+", "_", name) or "data"


def _same(path: Path, manifest) -> bool:
    if not path.exists():
        return False
    try:
        return json.loads(path.read_text()).get("splits") == manifest.splits
    except (OSError, json.JSONDecodeError):
        return False
