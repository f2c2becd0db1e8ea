"""The rerank section of bench/models.py (`--only rerank`): the cross-encoder on torch fp32
versus ONNX Runtime (rag.onnx_rerank) fp32 and int8, on SciFact test queries x BM25 top
candidates.

No trained reranker exists on the benchmark machine, so the model is the one `ragpilot
train-reranker` starts from (rl.adaptation.reranker_model.load_cross_encoder: the packaged
MiniLM encoder, identity pooler, a freshly initialised 1-logit head, seeded), saved with a
train-reranker manifest (max_length 192, as configs/rl/reranker.yaml). Its scores carry no
relevance signal, so the rows measure cost and fidelity to torch, not ranking quality:

  rerank-ce-minilm-<runtime>   cpu_s_per_query (process CPU seconds to score one query's
                               candidates, --rerank-threads threads), wall_s_per_query
  rerank-ce-minilm-onnx-*      spearman_vs_torch (per query, over its candidates),
                               top1_agree_vs_torch, cpu_speedup_vs_torch (per-query torch CPU
                               s / this runtime's), export_s (constructor wall seconds: the
                               one-time export + quantise on a cold cache, only the session
                               load when the cache already holds the graph)
  rerank-ce-minilm-onnx-fp32   max_abs_diff_vs_torch
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import metric_row, plain_row

SYSTEM = "rerank-ce-minilm"
MAX_LENGTH = 192


def _spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def _build_model(out: Path, seed: int) -> Path:
    import json

    import torch

    from rl.adaptation.reranker_model import load_cross_encoder

    torch.manual_seed(seed)
    tok, model = load_cross_encoder("minilm", pooler_init="identity")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "manifest.json").write_text(json.dumps({"config": {"max_length": MAX_LENGTH}}))
    return out


def _timed(reranker, work) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Scores per query, CPU s per query, wall s per query (after one untimed warm-up)."""
    reranker.scores(*work[0])
    scores, cpu, wall = [], [], []
    for q, ps in work:
        t0, c0 = time.perf_counter(), time.process_time()
        scores.append(np.asarray(reranker.scores(q, ps), dtype=np.float64))
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return scores, np.asarray(cpu), np.asarray(wall)


def rerank_section(args, rows: list, notes: list, scifact) -> None:
    """Rows for the torch / ONNX fp32 / ONNX int8 cross-encoder (see the module docstring),
    appended to `rows`; `scifact` is bench/models.py's loader of the SciFact test queries."""
    import torch

    from rag.errors import RagError
    from rag.index.bm25 import TantivyBM25
    from rag.rerank import CrossEncoderReranker

    n_q, depth = (5, 20) if args.quick else (args.rerank_queries, args.rerank_depth)
    corpus, test_qs, _, _, _, ds_name = scifact(args.quick, args.seed)
    test_qs = test_qs[:n_q]
    with tempfile.TemporaryDirectory() as tmp:
        bm25 = TantivyBM25.build(corpus, directory=tmp)
        work = [(q, [corpus[h.id] for h in bm25.search(q, depth)]) for _, q in test_qs]
    ds = f"{ds_name.split('[')[0]}[:{n_q}]-bm25top{depth}"
    threads = args.rerank_threads
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = _build_model(Path(tmp) / "ce", args.seed)
        ref = CrossEncoderReranker(path)
        assert ref.max_length == MAX_LENGTH
        want, cpu_t, wall_t = _timed(ref, work)
        rows.append(metric_row(ds, f"{SYSTEM}-torch-fp32", "cpu_s_per_query", cpu_t, args.seed))
        rows.append(metric_row(ds, f"{SYSTEM}-torch-fp32", "wall_s_per_query", wall_t,
                               args.seed))
        print(f"{SYSTEM}-torch-fp32 {cpu_t.mean():.3f} CPU s/query", flush=True)
        for quant in (False, True):
            system = f"{SYSTEM}-onnx-{'int8' if quant else 'fp32'}"
            try:
                from rag.onnx_rerank import OnnxCrossEncoderReranker

                t0 = time.perf_counter()
                fast = OnnxCrossEncoderReranker(path, quantize=quant, threads=threads)
                export_s = time.perf_counter() - t0
            except (RagError, ImportError) as exc:
                notes.append(f"{system}: not run ({exc})")
                continue
            got, cpu, wall = _timed(fast, work)
            rows.append(metric_row(ds, system, "cpu_s_per_query", cpu, args.seed))
            rows.append(metric_row(ds, system, "wall_s_per_query", wall, args.seed))
            rows.append(metric_row(ds, system, "cpu_speedup_vs_torch", cpu_t / cpu, args.seed))
            rho = [_spearman(a, b) for a, b in zip(got, want, strict=True)]
            rows.append(metric_row(ds, system, "spearman_vs_torch", rho, args.seed))
            rows.append(metric_row(ds, system, "top1_agree_vs_torch",
                                   [float(np.argmax(a) == np.argmax(b))
                                    for a, b in zip(got, want, strict=True)], args.seed))
            rows.append(plain_row(ds, system, "export_s", export_s, 1))
            if not quant:
                diff = max(float(np.abs(a - b).max()) for a, b in zip(got, want, strict=True))
                rows.append(plain_row(ds, system, "max_abs_diff_vs_torch", diff,
                                      sum(len(p) for _, p in work)))
            print(f"{system} {cpu.mean():.3f} CPU s/query, spearman {np.mean(rho):.4f}",
                  flush=True)
    notes.append(
        f"rerank-ce-minilm: no trained reranker exists on this machine, so the cross-encoder is "
        f"train-reranker's starting point (packaged MiniLM, identity pooler, 1-logit head "
        f"initialised with seed {args.seed}, max_length {MAX_LENGTH}): its scores carry no "
        f"relevance signal, the rows measure cost and fidelity to torch only. {n_q} SciFact "
        f"test queries x BM25 top {depth}; {threads} thread(s) per runtime (torch intra-op, "
        "ONNX worker threads); CPU s = process CPU time per query after one warm-up query.")
