"""Shared fixtures. The synthetic world's indexes (real MiniLM, tantivy, FAISS, graph) are built
once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag.env import configure_runtime_env

configure_runtime_env()

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "datasets"


@pytest.fixture(scope="session")
def world():
    from rag.corpus.synthetic import make_synthetic_world

    return make_synthetic_world(seed=0)


@pytest.fixture(scope="session")
def world_indexes(world, tmp_path_factory):
    from rag.indexset import IndexSet

    idx = IndexSet.create(world.corpus, tmp_path_factory.mktemp("world-index"))
    idx.build_all(bm25=("tantivy", "bm25s"), dense=("flat",), graph=True)
    return idx


@pytest.fixture
def tiny_corpus():
    from rag.corpus import Corpus
    from rag.types import Passage

    return Corpus([
        Passage("cat", "The cat sat on the warm mat all afternoon.", "Cats"),
        Passage("dog", "Dogs were running through the city parks at dawn.", "Dogs"),
        Passage("statin", "Statins lower LDL cholesterol in adults with heart disease.",
                "Statins"),
        Passage("paris", "Paris is the capital and largest city of France.", "Paris"),
        Passage("rome", "Rome is the capital city of Italy, founded on seven hills.", "Rome"),
    ])


def require_shared() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"evaluation data not found at {SHARED} (the ../shared checkout)")
    return SHARED
