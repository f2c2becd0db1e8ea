"""Length-bucketed batching for encoders: texts of similar token length share a batch, so a
padded batch wastes little compute, and batches stay under a token budget (bounded memory).

Functions on token counts (no model) and the worker queue `run_longest_first`: `rag.onnx_encoder`,
`rag.onnx_rerank` and `rag.nomic_port` use them,
and tests/unit/test_batching.py checks them without weights.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np


def length_buckets(lengths: Sequence[int], batch_size: int,
                   max_tokens: int | None = None) -> list[np.ndarray]:
    """Indices into `lengths`, grouped into batches in ascending length order.

    Each batch holds at most `batch_size` texts and, when `max_tokens` is given, at most
    `max_tokens` padded tokens (len(batch) * longest member); a single text longer than the
    budget still gets a batch of its own. Every index appears exactly once; ties keep input
    order (stable sort), so the grouping is deterministic for a given input.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    for pos in range(len(order)):
        size = pos - start + 1
        width = int(lengths[order[pos]])  # ascending: the newest member is the longest
        full = size > batch_size or (max_tokens is not None and size * width > max_tokens)
        if full and size > 1:
            batches.append(order[start:pos])
            start = pos
    if start < len(order):
        batches.append(order[start:])
    return batches


def run_longest_first(batches: Sequence[np.ndarray], run: Callable[[np.ndarray], None],
                      threads: int, name: str) -> None:
    """Call `run(rows)` once per batch, longest batches first (the order `length_buckets`
    returns, reversed, so the workers finish together), on up to `threads` worker threads
    pulling from one queue; `run` writes its own results. An exception in a worker is raised
    here."""
    todo, lock = iter(list(batches)[::-1]), threading.Lock()

    def work() -> None:
        while True:
            with lock:
                rows = next(todo, None)
            if rows is None:
                return
            run(rows)

    workers = min(threads, len(batches))
    if workers <= 1:
        work()
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers, thread_name_prefix=name) as pool:
        for fut in [pool.submit(work) for _ in range(workers)]:
            fut.result()


def pad_batch(ids: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask): int64 [len(ids), longest], right-padded with `pad_id`;
    the mask is 1 on real tokens, 0 on padding."""
    width = max((len(x) for x in ids), default=0)
    out = np.full((len(ids), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for j, x in enumerate(ids):
        out[j, :len(x)] = x
        mask[j, :len(x)] = 1
    return out, mask


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of `hidden` [batch, seq, dim] over the positions where `mask` [batch, seq] is 1:
    float32 [batch, dim] (sentence-transformers' Pooling(mean))."""
    m = mask[:, :, None].astype(np.float32)
    return (hidden * m).sum(1) / np.clip(m.sum(1), 1e-9, None)


def l2_normalize(vecs: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), float32, in place when possible."""
    vecs = np.asarray(vecs, dtype=np.float32)
    vecs /= np.clip(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12, None)
    return vecs
