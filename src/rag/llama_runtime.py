"""The optional llama.cpp runtime (llama-cpp-python) for GGUF generators and embedders.

llama.cpp runs quantised GGUF weights as they are: Qwen2.5-Coder-1.5B Q4_K_M in ~1.2 GB where
transformers would dequantise it to 9 GB of fp32 (< 1 tok/s here), and SmolLM2-135M 3-4x
faster than transformers. PyPI ships llama-cpp-python as source only, so it is built once by
`scripts/build_llama_cpp.sh` (cached wheel) and never by the default set-up; without it every
class here raises ConfigError naming that script. `available()` lets tests skip.

Threads: registry option `threads`, else $RAGPILOT_LLAMA_THREADS, else 1 (with other work on
the cores, 2 threads collapsed decode speed here; measure before raising it).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag.errors import ConfigError
from rag.generation.base import Generator
from rag.generation.cache import GenerationCache, cache_key
from rag.generation.parse import parse_output
from rag.generation.prompts import get_prompt
from rag.types import Context, Generation

THREADS_ENV = "RAGPILOT_LLAMA_THREADS"
BUILD_HINT = "bash scripts/build_llama_cpp.sh (compiles llama-cpp-python once, ~9 min)"


def available() -> bool:
    """Whether llama-cpp-python can be imported (the optional runtime is installed)."""
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def _llama_cls():
    try:
        from llama_cpp import Llama
    except (ImportError, OSError) as exc:
        raise ConfigError("runtime", f"llama.cpp runtime not installed ({exc}); run "
                                     f"{BUILD_HINT}") from None
    return Llama


def _threads(threads: int | None) -> int:
    n = int(threads or os.environ.get(THREADS_ENV, 1))
    if n < 1:
        raise ConfigError("threads", f"must be >= 1, got {n}")
    return n


def gguf_fingerprint(path: Path) -> str:
    """sha256 of the first 4 MiB and the size: stable and fast for multi-GB files."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        h.update(f.read(1 << 22))
    h.update(str(Path(path).stat().st_size).encode())
    return h.hexdigest()[:12]


class LlamaCppGenerator(Generator):
    """A GGUF chat model on llama.cpp: greedy at temperature 0, the GGUF's own chat template,
    results cached on disk like the transformers generator.

    `stats` accumulates per-stage cost over uncached calls: load_ms, prefill_ms (prompt
    evaluation), decode_ms (token generation), tokens_in, tokens_out, calls. Token counts on
    each Generation are exact (llama.cpp's own usage counts). Calls are serialised with a lock:
    one llama.cpp context is not thread-safe.
    """

    def __init__(self, name: str, path: Path, threads: int | None = None, n_ctx: int = 4096,
                 cache: bool = True, seed: int = 0):
        llama = _llama_cls()
        self.name, self.path, self.seed = name, Path(path), seed
        self.threads = _threads(threads)
        t0 = time.perf_counter()
        self.llm = llama(model_path=str(self.path), n_ctx=n_ctx, n_threads=self.threads,
                         n_threads_batch=self.threads, seed=seed, verbose=False)
        self.fingerprint = f"{name}:llama_cpp:{gguf_fingerprint(self.path)}"
        self.cache = GenerationCache() if cache else None
        self.stats = {"load_ms": 1000 * (time.perf_counter() - t0), "prefill_ms": 0.0,
                      "decode_ms": 0.0, "tokens_in": 0, "tokens_out": 0, "calls": 0}
        self._lock = threading.Lock()

    def generate(self, question: str, contexts: Sequence[Context], prompt_id: str,
                 max_new_tokens: int = 48, temperature: float = 0.0,
                 abstain_threshold: float | None = None) -> Generation:
        # abstain_threshold is ignored: a `*_abstain` prompt asks the model itself to abstain
        tpl = get_prompt(prompt_id)
        messages = tpl.messages(question, contexts)
        key = cache_key(self.fingerprint, prompt_id, messages, max_new_tokens, temperature)
        if self.cache and (hit := self.cache.get(key)):
            return hit
        with self._lock:
            before = self._perf()
            t0 = time.perf_counter()
            out = self.llm.create_chat_completion(
                messages=messages, max_tokens=max_new_tokens, temperature=temperature,
                top_k=1 if temperature <= 0 else 40, repeat_penalty=1.0, seed=self.seed)
            wall_ms = 1000 * (time.perf_counter() - t0)
            after = self._perf()
        raw = out["choices"][0]["message"]["content"] or ""
        usage = out.get("usage") or {}
        t_in, t_out = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
        self._account(before, after, wall_ms, t_in, t_out)
        text, cites = parse_output(raw, len(contexts), tpl.concise, question)
        g = Generation(text, raw, cites if tpl.cites else (), t_in, t_out)
        if self.cache:
            self.cache.put(key, g)
        return g

    def _perf(self) -> tuple[float, float] | None:
        """llama.cpp's cumulative (prompt eval ms, eval ms), when the binding exposes them."""
        try:
            import llama_cpp

            p = llama_cpp.llama_perf_context(self.llm.ctx)
            return float(p.t_p_eval_ms), float(p.t_eval_ms)
        except Exception:  # an older/newer binding without the perf API: fall back to wall time
            return None

    def _account(self, before, after, wall_ms: float, t_in: int, t_out: int) -> None:
        s = self.stats
        if before is not None and after is not None and after[0] + after[1] > 0:
            s["prefill_ms"] += after[0] - before[0]
            s["decode_ms"] += after[1] - before[1]
        else:
            s["decode_ms"] += wall_ms
        s["tokens_in"] += t_in
        s["tokens_out"] += t_out
        s["calls"] += 1


class LlamaCppEncoder:
    """A GGUF embedding model (e.g. nomic-embed-text-v1.5) on llama.cpp, the
    `rag.encoders.Encoder` contract: `encode(texts) -> (n, dim)` float32 unit rows, pooling as
    the GGUF declares (mean for nomic-bert). Prefixes come from the registry entry
    (`rag.encoders._load` sets `query_prefix` / `document_prefix`). Texts longer than `n_ctx`
    tokens are truncated.
    """

    def __init__(self, name: str, path: Path, threads: int | None = None, n_ctx: int = 2048,
                 texts_per_call: int = 1):
        llama = _llama_cls()
        self.name, self.path, self.device = name, Path(path), "cpu"
        self.texts_per_call = max(1, int(texts_per_call))
        self.threads = _threads(threads)
        self.llm = llama(model_path=str(self.path), embedding=True, n_ctx=n_ctx, n_batch=n_ctx,
                         n_ubatch=n_ctx, n_threads=self.threads, n_threads_batch=self.threads,
                         verbose=False)
        self.dim = int(self.llm.n_embd())
        # "-gguf": the GGUF's own embedding, whichever faithful runtime computes it; the torch
        # port (rag.nomic_port) agrees to cosine >= 0.9999, so they share cached vectors
        self.fingerprint = f"{gguf_fingerprint(self.path)}-gguf"
        self.query_prefix = self.document_prefix = ""
        self.calls = 0
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False,
               normalize: bool = True) -> np.ndarray:
        """(n, dim) float32 in the order of `texts`; unit rows when `normalize`.

        `batch_size` (the callers' hint) is ignored: `self.texts_per_call` texts go to llama.cpp
        per call, 1 by default, because packed sequences share one masked attention over the
        whole batch (one at a time is faster on long passages: docs/design-notes.md)."""
        texts = list(texts)
        self.calls += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        bar = None
        if show_progress:
            from tqdm import tqdm

            bar = tqdm(total=len(texts), desc=f"encode {self.name}", unit="text")
        with self._lock:
            step = self.texts_per_call
            for s in range(0, len(texts), step):
                vecs = self.llm.embed(texts[s:s + step], normalize=False, truncate=True)
                out[s:s + len(vecs)] = np.asarray(vecs, dtype=np.float32)
                if bar:
                    bar.update(len(vecs))
        if bar:
            bar.close()
        if normalize and len(out):
            out /= np.clip(np.linalg.norm(out, axis=1, keepdims=True), 1e-12, None)
        return out

    def encode_queries(self, texts: Sequence[str], **kw) -> np.ndarray:
        return self.encode([self.query_prefix + t for t in texts], **kw)

    def encode_documents(self, texts: Sequence[str], **kw) -> np.ndarray:
        return self.encode([self.document_prefix + t for t in texts], **kw)
