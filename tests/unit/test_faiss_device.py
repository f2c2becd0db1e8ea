"""The FAISS device option of rag.index.dense: cpu | gpu (| cuda), chosen per retriever
(`faiss_device`), per process ($RAGPILOT_FAISS_DEVICE) or with the encoder's `device`.
On a machine without a GPU faiss build every GPU request is a ConfigError naming the key that
asked for it; on one with a GPU the flat index runs there and returns what the CPU index does.
"""

from __future__ import annotations

import numpy as np
import pytest

from rag.errors import ConfigError
from rag.index.dense import (
    FAISS_DEVICE_ENV,
    DenseRetriever,
    _make_index,
    faiss_gpu_available,
    resolve_faiss_device,
)

VECS = np.eye(6, 8, dtype=np.float32)
IDS = [f"p{i}" for i in range(6)]


def test_resolution_order(monkeypatch) -> None:
    monkeypatch.delenv(FAISS_DEVICE_ENV, raising=False)
    assert resolve_faiss_device("cpu") == ("cpu", "device")
    assert resolve_faiss_device("cpu", "gpu") == ("cuda", "faiss_device")
    monkeypatch.setenv(FAISS_DEVICE_ENV, "gpu")
    assert resolve_faiss_device("cpu") == ("cuda", FAISS_DEVICE_ENV)
    assert resolve_faiss_device("cpu", "cpu") == ("cpu", "faiss_device")
    monkeypatch.setenv(FAISS_DEVICE_ENV, "tpu")
    with pytest.raises(ConfigError) as e:
        resolve_faiss_device("cpu")
    assert e.value.field == FAISS_DEVICE_ENV and "tpu" in e.value.message


def test_cpu_index_answers_and_hnsw_gpu_is_refused(monkeypatch) -> None:
    monkeypatch.delenv(FAISS_DEVICE_ENV, raising=False)
    r = DenseRetriever(_make_index(VECS, "flat"), VECS, IDS, encoder=None, index_kind="flat",
                       faiss_device="cpu")
    hits = r.search_vectors(VECS[[2]], 3)[0]
    assert hits[0].id == "p2" and hits[0].score == pytest.approx(1.0)
    with pytest.raises(ConfigError) as e:
        DenseRetriever(_make_index(VECS, "hnsw"), VECS, IDS, None, "hnsw", faiss_device="gpu")
    assert e.value.field == "faiss_device" and "HNSW" in e.value.message


@pytest.mark.skipif(faiss_gpu_available(), reason="this faiss has GPU support")
def test_gpu_without_gpu_faiss_names_the_key(monkeypatch) -> None:
    monkeypatch.setenv(FAISS_DEVICE_ENV, "gpu")
    with pytest.raises(ConfigError) as e:
        DenseRetriever(_make_index(VECS, "flat"), VECS, IDS, None, "flat")
    assert e.value.field == FAISS_DEVICE_ENV and "faiss-gpu" in e.value.message
    monkeypatch.delenv(FAISS_DEVICE_ENV)
    with pytest.raises(ConfigError) as e:
        DenseRetriever(_make_index(VECS, "flat"), VECS, IDS, None, "flat", faiss_device="gpu")
    assert e.value.field == "faiss_device"


@pytest.mark.skipif(not faiss_gpu_available(),
                    reason="no GPU faiss build or no GPU visible (install the gpu extra on a "
                           "GPU machine)")
def test_gpu_flat_index_matches_cpu() -> None:
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(2000, 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ids = [str(i) for i in range(len(vecs))]
    cpu = DenseRetriever(_make_index(vecs, "flat"), vecs, ids, None, "flat")
    gpu = DenseRetriever(_make_index(vecs, "flat"), vecs, ids, None, "flat", faiss_device="gpu")
    q = vecs[:50] + 0.01 * rng.normal(size=(50, 384)).astype(np.float32)
    for a, b in zip(cpu.search_vectors(q, 10), gpu.search_vectors(q, 10), strict=True):
        assert [h.id for h in a] == [h.id for h in b]
