"""The dataset bundle every learner and tuner opens: a dataset, its indexes and its named splits
(train feeds learners, valid is what tuners optimise, test only reports)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rag.corpus.loaders import Dataset, load_dataset
from rag.errors import ConfigError
from rag.indexset import IndexSet
from rag.models import cache_dir
from rag.types import Example


@dataclass
class TuningData:
    """A dataset with its indexes and named splits (valid = tune on, test = holdout)."""

    name: str
    dataset: Dataset
    indexes: IndexSet
    splits: dict[str, list[Example]]

    @classmethod
    def open(cls, name: str, root: str | Path | None = None) -> TuningData:
        """Load `name` (see `rag.corpus.loaders.load_dataset`), its committed split manifest
        (configs/splits/<name>.json; the synthetic world splits itself, seed 13), and open or
        build its indexes under `root` (default: <cache>/indexes/<name>-<fingerprint>)."""
        from rag.corpus.hygiene import load_split, stratified_split

        ds = load_dataset(name)
        if name == "synthetic":
            manifest = stratified_split(ds.examples, {"valid": 0.5, "test": 0.5}, seed=13,
                                        name=name)
        else:
            manifest = load_split(name)
        by_id = {e.id: e for e in ds.examples}
        splits = {s: [by_id[i] for i in ids if i in by_id] for s, ids in manifest.splits.items()}
        splits = {s: ex for s, ex in splits.items() if ex}
        base = Path(root) if root else cache_dir() / "indexes"
        d = base / f"{name}-{ds.corpus.fingerprint()}"
        idx = IndexSet.open(d) if (d / "corpus.jsonl").exists() else IndexSet.create(
            ds.corpus, d, manifest=ds.manifest_dict(), show_progress=False)
        return cls(name, ds, idx, splits)

    def examples(self, split: str) -> list[Example]:
        if split not in self.splits:
            raise ConfigError("split", f"unknown split {split!r} for {self.name} (have: "
                                       f"{', '.join(sorted(self.splits))})")
        return self.splits[split]
