"""Cached, batch-invariant unit vectors of texts for the quality metrics (`Embedder`).

Embeddings are batch-invariant: texts are grouped by exact token length, so no text is ever
padded, and every encoder call has the same shape (`chunk` = 2 texts of one length; a lone text
is paired with itself). Row results of a fixed-shape call do not depend on the other rows, so a
text gets bit-identical vectors whatever else is in the batch (checked in tests/test_quality.py;
on CPU torch, batches of different sizes differ in the last bits for short texts, and larger
fixed chunks were no faster on 1-2 threads).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Mapping, Sequence

import numpy as np


def text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


class Embedder:
    """Cached, batch-invariant unit vectors of texts (module docstring: texts grouped by token length).

    `ensure({metric: texts})` encodes every text not cached yet in one pass and books the work
    against the first metric that asked for it; `usage` holds, per metric, `encoder_calls`
    (Encoder.encode invocations that carried its texts), `texts` and `tokens` (word pieces,
    special tokens included) encoded for it, and `cache_hits`.
    """

    def __init__(self, encoder=None, encoder_name: str = "minilm", chunk: int = 2,
                 max_cache: int = 200_000):
        self._encoder = encoder
        self.encoder_name = encoder_name
        self.chunk = max(2, int(chunk))
        self.max_cache = max_cache
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.RLock()
        self.usage: dict[str, dict[str, float]] = defaultdict(
            lambda: {"encoder_calls": 0, "texts": 0, "tokens": 0, "cache_hits": 0})
        self.seconds = 0.0

    @property
    def encoder(self):
        if self._encoder is None:
            from rag.encoders import Encoder

            self._encoder = Encoder.from_registry(self.encoder_name)
        return self._encoder

    def _lengths(self, texts: list[str]) -> list[int]:
        model = getattr(self.encoder, "model", None)
        tok = getattr(model, "tokenizer", None)
        if tok is None:  # a stand-in encoder without a tokenizer: whitespace tokens
            return [len(t.split()) + 2 for t in texts]
        ids = tok(texts, truncation=True, max_length=int(model.max_seq_length))["input_ids"]
        return [len(x) for x in ids]

    def ensure(self, requests: Mapping[str, Sequence[str]]) -> None:
        with self._lock:
            owner: dict[str, str] = {}
            for metric, texts in requests.items():
                u = self.usage[metric]
                for t in dict.fromkeys(texts):
                    k = text_key(t)
                    if k in self._cache or k in owner:
                        u["cache_hits"] += 1
                        if k in self._cache:
                            self._cache.move_to_end(k)
                    else:
                        owner[k] = metric
            if not owner:
                return
            todo = {}
            for metric, texts in requests.items():
                for t in texts:
                    k = text_key(t)
                    if owner.get(k) == metric:
                        todo.setdefault(k, t)
            keys, texts = list(todo), [t.strip() or "." for t in todo.values()]
            t0 = time.perf_counter()
            lengths = self._lengths(texts)
            groups: dict[int, list[int]] = defaultdict(list)
            for i, n in enumerate(lengths):
                groups[n].append(i)
            for n in sorted(groups):
                idx = groups[n]
                for j in range(0, len(idx), self.chunk):
                    part = idx[j:j + self.chunk]
                    batch = [texts[i] for i in part]
                    batch += [batch[0]] * (self.chunk - len(batch))  # every call is (chunk, n)
                    vecs = self.encoder.encode(batch, batch_size=self.chunk)
                    for metric in {owner[keys[i]] for i in part}:
                        self.usage[metric]["encoder_calls"] += 1
                    for r, i in enumerate(part):
                        self._cache[keys[i]] = np.asarray(vecs[r], dtype=np.float32)
                        u = self.usage[owner[keys[i]]]
                        u["texts"] += 1
                        u["tokens"] += lengths[i]
            self.seconds += time.perf_counter() - t0
            while len(self._cache) > self.max_cache:
                self._cache.popitem(last=False)

    def get(self, text: str) -> np.ndarray:
        k = text_key(text)
        v = self._cache.get(k)
        if v is None:  # not planned for (or evicted): encode now
            self.ensure({"unplanned": [text]})
            v = self._cache[k]
        return v

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()

