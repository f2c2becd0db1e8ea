"""Write the committed split manifests (configs/splits/*.json). Run once; re-running with the
same sources and seed reproduces them byte for byte (a test checks that)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rag.corpus.hygiene import SPLITS_DIR, stratified_split  # noqa: E402
from rag.corpus.loaders import data_root, load_beir, load_hotpotqa, load_mtrag  # noqa: E402
from rag.env import configure_runtime_env  # noqa: E402

configure_runtime_env()

SEED = 13


def build_all() -> dict:
    root = data_root()
    hp = load_hotpotqa(root / "hotpotqa" / "hotpot_dev_distractor_1100.jsonl")
    sf_test = load_beir(root / "scifact", "test")
    sf_train = load_beir(root / "scifact", "train")
    mt = load_mtrag(root / "mtrag" / "mtragun-human" / "generation_tasks" / "reference.jsonl")
    out = {
        "hotpotqa": stratified_split(hp.examples, {"train": 500, "valid": 300, "test": 300},
                                     SEED, "hotpotqa", {Path(p).name: s
                                                        for p, s in hp.sources.items()}),
        "mtrag": stratified_split(mt.examples, {"train": 0.4, "valid": 0.3, "test": 0.3}, SEED,
                                  "mtrag", {Path(p).name: s for p, s in mt.sources.items()}),
    }
    sf = stratified_split(sf_test.examples, {"valid": 100, "test": 200}, SEED, "scifact",
                          {Path(p).name: s for p, s in {**sf_test.sources,
                                                        **sf_train.sources}.items()})
    sf.splits["train"] = sorted(e.id for e in sf_train.examples)
    sf.check_disjoint()
    out["scifact"] = sf
    return out


if __name__ == "__main__":
    SPLITS_DIR.mkdir(parents=True, exist_ok=True)
    for name, m in build_all().items():
        m.save(SPLITS_DIR / f"{name}.json")
        print(name, {k: len(v) for k, v in m.splits.items()})
