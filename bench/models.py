"""Stronger and faster models (issue 20): fast MiniLM, nomic embeddings, Qwen2.5-Coder-1.5B.

    python bench/models.py            # full: SciFact test (5,183 docs, 300 queries), Qwen on
                                      # --llm-n HotpotQA test questions (hours on 2 cores)
    python bench/models.py --only generators --threads 1   # the Qwen acceptance rows alone
    python bench/models.py --only encoders    # the SciFact encoder rows alone
    python bench/models.py --only encoders --reuse-fp32 --no-nomic   # MiniLM rows only
    python bench/models.py --only rerank      # the cross-encoder rows alone (torch vs ONNX
                                              # fp32/int8, bench/models_rerank.py)
    A run of one section (`--only`, `--no-nomic`) writes models.<section>.json, never into
    the full run's models.json.
    python bench/models.py --quick    # minutes: MiniLM fp32 vs int8 on a 1,500-doc sub-corpus
                                      # (50 queries); nomic on --nomic-docs docs and Qwen on
                                      # --llm-n 3 questions, for per-item cost and projections

Rows (bench/common conventions):
  dense-minilm / dense-minilm-fast   index_build_s (load the encoder, embed the corpus with an
                                     empty embedding cache, build FAISS flat; wall seconds with
                                     --encoder-threads), index_build_cpu_s (process CPU seconds:
                                     what the build costs whatever else runs), loadavg_1m_mean
                                     (sampled every 5 s during the build), ndcg@10
  dense-minilm-fast                  index_tflop and floor_index_build_s_int8: the FLOPs of the
                                     build (token counts x MiniLM's layer shapes) and the wall
                                     seconds they need on 2 cores at the measured per-core rate
                                     (`sgemm-1-thread` gflop_per_cpu_s), int8 linear layers at
                                     twice it: what no implementation can beat here
  dense-nomic / hybrid-nomic         ndcg@10 (full only, and only when the full encode projects
                                     under --nomic-max-min; hybrid = min-max fusion with
                                     tantivy BM25, w chosen on SciFact train queries),
                                     encode_s_per_doc / encode_cpu_s_per_doc and
                                     projected_index_build_s (from --nomic-docs docs)
  qwen2.5-coder-1.5b / smollm2-135m  answer_f1 and em on HotpotQA test questions, zero-shot,
                                     `cite_concise` prompt, both on llama.cpp; --contexts hybrid
                                     (default: the default pipeline's hybrid k=5 contexts) and/or
                                     gold (rows `<label>@gold`: the generator ceiling);
                                     generate_s_per_q, prefill/decode_tok_s, load_s, and the
                                     paired F1 difference with its CI (bench/models_generators.py)
  rerank-ce-minilm-{torch-fp32, onnx-fp32, onnx-int8}   cpu_s_per_query, spearman_vs_torch, ...
                                     (bench/models_rerank.py; an untrained head: cost and
                                     fidelity to torch, not quality)
Qwen and nomic need `ragpilot models pull ...` and the llama.cpp runtime
(scripts/build_llama_cpp.sh); minilm-fast needs the `models` extra. Missing pieces are reported
and their rows left out, never faked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import make_meta, metric_row, plain_row, write_results  # noqa: E402
from bench.models_generators import HOTPOT, generator_section  # noqa: E402
from rag.corpus import Corpus  # noqa: E402
from rag.corpus.loaders import data_root, load_beir  # noqa: E402
from rag.encoders import Encoder, encode_queries  # noqa: E402
from rag.errors import RagError  # noqa: E402
from rag.fusion import fuse_scores  # noqa: E402
from rag.index.dense import _make_index, embed_corpus  # noqa: E402
from rag.metrics.retrieval import per_query_scores  # noqa: E402
from rag.models import cache_dir  # noqa: E402
from rag.onnx_encoder import THREADS_ENV  # noqa: E402
from rag.types import Hit  # noqa: E402


class LoadSampler:
    """The 1-minute load average every `every` s while a build runs (a shared machine: a
    wall time means little without it). `.summary()` -> (mean, max)."""

    def __init__(self, every: float = 5.0):
        import threading

        self.values = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.values.append(os.getloadavg()[0])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.values.append(os.getloadavg()[0])

    def summary(self) -> tuple[float, float]:
        return float(np.mean(self.values)), float(np.max(self.values))


def sgemm_gflops_per_cpu_s(seconds: float = 2.0) -> float:
    """fp32 GFLOP per CPU second of one thread on a BERT-sized GEMM (256x384 @ 384x1536, numpy's
    BLAS): what this CPU delivers per core, whatever else runs (CPU time, not wall)."""
    import threadpoolctl

    a = np.random.default_rng(0).random((256, 384), dtype=np.float32)
    b = np.random.default_rng(1).random((384, 1536), dtype=np.float32)
    with threadpoolctl.threadpool_limits(1):
        for _ in range(10):
            a @ b
        n, c0 = 0, time.process_time()
        while time.process_time() - c0 < seconds:
            a @ b
            n += 1
        return 2 * 256 * 384 * 1536 * n / (time.process_time() - c0) / 1e9


def flop_floor(enc, corpus: Corpus, gflops_core: float, cores: int = 2) -> dict:
    """FLOPs of one full encode of `corpus` with `enc` (BERT: 2 x (4h^2 + 2hf) per token per
    layer in the linear layers, 4 x seq x h per token per layer in attention) and the wall
    seconds it needs at `gflops_core` per core on `cores` cores: fp32, and int8 at twice the
    rate (AVX2 u8s8: vpmaddubsw + vpmaddwd retire 32 MACs/cycle, fp32 FMA 16)."""
    cfg = json.loads((Path(enc.path) / "config.json").read_text())
    h, f, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    texts = [f"{p.title}. {p.text}" if p.title else p.text for p in corpus]
    seq = np.array([len(e.ids) for e in enc.tokenizer.encode_batch(texts)], dtype=np.float64)
    linear = float(seq.sum()) * layers * 2 * (4 * h * h + 2 * h * f)
    attention = float((seq ** 2).sum()) * layers * 4 * h
    peak = gflops_core * 1e9 * cores
    return {"tokens": int(seq.sum()), "max_length": enc.max_length,
            "linear_tflop": linear / 1e12, "attention_tflop": attention / 1e12,
            "floor_fp32_s": (linear + attention) / peak,
            "floor_int8_s": linear / (2 * peak) + attention / peak,
            "gflops_per_core": gflops_core, "cores": cores}


def scifact(quick: bool, seed: int):
    """(corpus, test [(qid, question)], test qrels, train [(qid, q)], train qrels, name)."""
    test, train = load_beir(data_root() / "scifact", "test"), load_beir(data_root() / "scifact",
                                                                       "train")
    corpus, test_ex, train_ex = test.corpus, list(test.examples), list(train.examples)[:300]
    if quick:  # the same sub-corpus rule as bench/retrieval.py --quick
        test_ex, train_ex = test_ex[:50], train_ex[:100]
        keep = {d for e in test_ex + train_ex for d in e.qrels}
        others = [p.id for p in corpus if p.id not in keep]
        rng = np.random.default_rng(seed)
        keep |= set(rng.choice(others, size=1500 - len(keep), replace=False).tolist())
        corpus = Corpus([p for p in corpus if p.id in keep])
    name = "scifact/test[:50]-sub1500" if quick else "scifact/test"
    return (corpus, [(e.id, e.question) for e in test_ex], {e.id: dict(e.qrels) for e in test_ex},
            [(e.id, e.question) for e in train_ex], {e.id: dict(e.qrels) for e in train_ex}, name)


def dense_build(encoder_name: str, corpus: Corpus):
    """(encoder, passage vectors, wall s, CPU s, (load mean, load max)): load + embed (no
    embedding cache) + FAISS flat."""
    with LoadSampler() as load:
        t0, c0 = time.perf_counter(), time.process_time()
        enc = Encoder.from_registry(encoder_name)
        vecs = embed_corpus(corpus, enc, show_progress=True, use_cache=False)
        _make_index(vecs, "flat")
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return enc, vecs, secs, cpu, load.summary()


def dense_hits(enc, vecs, corpus: Corpus, qs, top_n: int = 100) -> dict[str, list[Hit]]:
    q = encode_queries(enc, [t for _, t in qs])
    scores = q @ vecs.T
    ids = corpus.ids
    out = {}
    for (qid, _), row in zip(qs, scores, strict=True):
        top = np.argsort(-row, kind="stable")[:top_n]
        out[qid] = [Hit(float(row[i]), ids[i]) for i in top]
    return out


def as_run(hits: dict[str, list[Hit]]) -> dict[str, dict[str, float]]:
    return {q: {h.id: float(len(hs) - i) for i, h in enumerate(hs)} for q, hs in hits.items()}


def hybrid(dense: dict, sparse: dict, w: float) -> dict[str, list[Hit]]:
    return {q: fuse_scores([sparse[q], dense[q]], [1 - w, w], top_n=100) for q in dense}


def fp32_from_cache(args, corpus: Corpus, ds: str, rows: list, notes: list):
    """The fp32 reference without its ~300 CPU s full encode: vectors from the embedding cache
    (the same encoder fingerprint built them, so nDCG is exact) and the build cost timed on
    --cost-docs random abstracts, projected to the corpus. Without a cache the row is reported as not run."""
    enc = Encoder.from_registry("minilm")
    path = cache_dir() / "embeddings" / f"{corpus.fingerprint()}-{enc.fingerprint}.npy"
    if not path.exists():
        raise RagError(f"--reuse-fp32: no cached fp32 embeddings at {path}")
    vecs = np.load(path)
    docs = list(corpus)
    pick = np.random.default_rng(args.seed).choice(len(docs), args.cost_docs, replace=False)
    sample = Corpus([docs[i] for i in sorted(pick)])
    t0, c0 = time.perf_counter(), time.process_time()
    embed_corpus(sample, enc, use_cache=False)
    wall, cpu = [(x / len(sample)) for x in (time.perf_counter() - t0, time.process_time() - c0)]
    rows.append(plain_row(ds, "dense-minilm", "encode_s_per_doc", wall, len(sample)))
    rows.append(plain_row(ds, "dense-minilm", "encode_cpu_s_per_doc", cpu, len(sample)))
    rows.append(plain_row(ds, "dense-minilm", "projected_index_build_cpu_s", cpu * len(docs),
                          len(docs)))
    notes.append(f"dense-minilm (fp32 reference): nDCG from its cached embeddings ({path.name});"
                 f" build cost timed on {len(sample)} random abstracts: {wall:.3f} s/doc wall, "
                 f"{cpu:.3f} CPU s/doc -> ~{cpu * len(docs):.0f} CPU s for the index.")
    return enc, vecs


def retrieval_section(args, rows: list, notes: list) -> None:
    corpus, test_qs, qrels, train_qs, train_qrels, ds = scifact(args.quick, args.seed)
    per_q: dict[str, np.ndarray] = {}
    for name, system in (("minilm", "dense-minilm"), ("minilm-fast", "dense-minilm-fast")):
        try:
            if name == "minilm-fast":  # the one-time ONNX export is set-up, not index build
                Encoder.from_registry(name)
                from rag import encoders

                encoders._LOADED.pop((name, "cpu"), None)
            if name == "minilm" and args.reuse_fp32 and not args.quick:
                enc, vecs = fp32_from_cache(args, corpus, ds, rows, notes)
            else:
                enc, vecs, secs, cpu, (load, load_max) = dense_build(name, corpus)
                rows.append(plain_row(ds, system, "index_build_s", secs, len(corpus)))
                rows.append(plain_row(ds, system, "index_build_cpu_s", cpu, len(corpus)))
                rows.append(plain_row(ds, system, "loadavg_1m_mean", load, len(corpus)))
                notes.append(f"{system} build: {secs:.1f} s wall, {cpu:.1f} CPU s with "
                             f"{getattr(enc, 'threads', args.encoder_threads)} encoder "
                             f"thread(s); 1-minute load average during it {load:.2f} (max "
                             f"{load_max:.2f}) on {os.cpu_count()} CPUs.")
                print(f"{system:<20} build {secs:.1f} s ({cpu:.0f} CPU s, load {load:.1f})",
                      flush=True)
                if name == "minilm-fast":
                    floor_rows(args, enc, corpus, ds, rows, notes)
        except (RagError, ImportError) as exc:
            notes.append(f"{system}: not run ({exc})")
            continue
        run = as_run(dense_hits(enc, vecs, corpus, test_qs))
        per_q[system] = np.asarray(per_query_scores(run, qrels, "ndcg@10"), dtype=float)
        rows.append(metric_row(ds, system, "ndcg@10", per_q[system], args.seed))
        print(f"{system:<20} ndcg@10 {rows[-1]['value']:.4f}", flush=True)
    if len(per_q) == 2:  # the fast path's quality cost, paired over the same queries
        rows.append(metric_row(ds, "dense-minilm-fast - dense-minilm", "ndcg@10_diff",
                               per_q["dense-minilm-fast"] - per_q["dense-minilm"], args.seed))
        target_notes(rows, notes)
    if not args.no_nomic:
        nomic_section(args, corpus, test_qs, qrels, train_qs, train_qrels, ds, rows, notes)


def target_notes(rows: list, notes: list) -> None:
    """Issue 20's two conditions on minilm-fast, each with its measured margin."""
    def get(system: str, metric: str) -> dict | None:
        return next((r for r in rows if r["system"] == system and r["metric"] == metric), None)

    build, diff = get("dense-minilm-fast", "index_build_s"), get(
        "dense-minilm-fast - dense-minilm", "ndcg@10_diff")
    load = get("dense-minilm-fast", "loadavg_1m_mean")
    if build is not None:
        met = "met" if build["value"] <= 60 else "MISSED"
        notes.append(f"dense-minilm-fast target index_build_s <= 60: {build['value']:.1f} s "
                     f"({met}, margin {60 - build['value']:+.1f} s) at load "
                     f"{load['value'] if load else float('nan'):.1f} on 2 CPUs.")
    if diff is not None:
        met = "met" if abs(diff["value"]) <= 0.005 else (
            "not a loss; |diff| > 0.005" if diff["value"] > 0 else "MISSED")
        notes.append(f"dense-minilm-fast target ndcg@10 within 0.005 of fp32: "
                     f"{diff['value']:+.4f} [{diff['ci_low']:+.4f}, {diff['ci_high']:+.4f}] "
                     f"({met}).")


def floor_rows(args, enc, corpus: Corpus, ds: str, rows: list, notes: list) -> None:
    """What the index build cannot go under on this machine (FLOP count / measured peak)."""
    g = sgemm_gflops_per_cpu_s()
    fl = flop_floor(enc, corpus, g)
    rows.append(plain_row(ds, "dense-minilm-fast", "index_tflop",
                          fl["linear_tflop"] + fl["attention_tflop"], len(corpus)))
    rows.append(plain_row(ds, "dense-minilm-fast", "floor_index_build_s_int8",
                          fl["floor_int8_s"], len(corpus)))
    rows.append(plain_row(ds, "sgemm-1-thread", "gflop_per_cpu_s", g, 1))
    notes.append(
        f"dense-minilm-fast floor: {fl['tokens']:,} tokens at max_length {fl['max_length']} = "
        f"{fl['linear_tflop']:.1f} TFLOP linear + {fl['attention_tflop']:.1f} TFLOP attention; "
        f"one core here does {g:.0f} fp32 GFLOP per CPU second (numpy sgemm), so 2 cores need "
        f">= {fl['floor_fp32_s']:.0f} s in fp32 and >= {fl['floor_int8_s']:.0f} s with int8 "
        "linear layers at twice the fp32 rate (AVX2 has no VNNI: u8s8 via vpmaddubsw + "
        "vpmaddwd), before any overhead.")


def nomic_section(args, corpus, test_qs, qrels, train_qs, train_qrels, ds, rows, notes):
    name = "nomic-embed-text-v1.5"
    try:
        enc = Encoder.from_registry(name)
    except (RagError, ImportError) as exc:
        notes.append(f"dense-nomic / hybrid-nomic: not run ({exc})")
        return
    docs = list(corpus)
    pick = np.random.default_rng(args.seed).choice(len(docs), args.nomic_docs, replace=False)
    sample = Corpus([docs[i] for i in sorted(pick)])  # random: the first docs are not typical
    t0, c0 = time.perf_counter(), time.process_time()
    embed_corpus(sample, enc, use_cache=False)
    per_doc = (time.perf_counter() - t0) / len(sample)
    cpu_doc = (time.process_time() - c0) / len(sample)
    rows.append(plain_row(ds, "dense-nomic", "encode_s_per_doc", per_doc, len(sample)))
    rows.append(plain_row(ds, "dense-nomic", "encode_cpu_s_per_doc", cpu_doc, len(sample)))
    full_docs = 5183
    rows.append(plain_row("scifact/test", "dense-nomic", "projected_index_build_s",
                          per_doc * full_docs, full_docs))
    print(f"dense-nomic          {per_doc:.2f} s/doc -> ~{per_doc * full_docs / 3600:.1f} h "
          f"for SciFact's {full_docs} docs", flush=True)
    runtime = f"{type(enc).__name__}, {getattr(enc, 'threads', '?')} thread(s)"
    notes.append(f"dense-nomic cost ({runtime}): {per_doc:.2f} s/doc wall, {cpu_doc:.2f} CPU "
                 f"s/doc on {len(sample)} random SciFact abstracts -> ~{per_doc * full_docs / 60:.0f}"
                 f" min for the {full_docs}-doc index on this shared machine.")
    cached = (cache_dir() / "embeddings" / f"{corpus.fingerprint()}-{enc.fingerprint}.npy").exists()
    too_slow = per_doc * full_docs / 60 > args.nomic_max_min and not cached
    if args.quick or too_slow:
        why = (f"the full encode projects to {per_doc * full_docs / 60:.0f} min > "
               f"--nomic-max-min {args.nomic_max_min:g}" if too_slow else "full run only")
        notes.append(f"dense-nomic / hybrid-nomic ndcg@10: not run ({why}).")
        return
    vecs = embed_corpus(corpus, enc, show_progress=True)  # cached: a rerun encodes nothing
    dense_test = dense_hits(enc, vecs, corpus, test_qs)
    run = as_run(dense_test)
    rows.append(metric_row(ds, "dense-nomic", "ndcg@10", per_query_scores(run, qrels, "ndcg@10"),
                           args.seed))
    from rag.index.bm25 import TantivyBM25

    with tempfile.TemporaryDirectory() as tmp:
        bm25 = TantivyBM25.build(corpus, directory=tmp)
        sparse = {q: bm25.search(t, 100) for q, t in test_qs + train_qs}
    dense_train = dense_hits(enc, vecs, corpus, train_qs)
    grid = {w: float(np.mean(per_query_scores(as_run(hybrid(dense_train, sparse, w)),
                                              train_qrels, "ndcg@10")))
            for w in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)}
    w = max(grid, key=lambda k: (grid[k], -abs(k - 0.5)))
    run = as_run(hybrid(dense_test, sparse, w))
    rows.append(metric_row(ds, "hybrid-nomic", "ndcg@10",
                           per_query_scores(run, qrels, "ndcg@10"), args.seed))
    notes.append(f"hybrid-nomic: min-max fusion with tantivy BM25, w={w} (dense weight) chosen "
                 f"on {len(train_qs)} SciFact train queries.")
    if cached:
        notes.append(f"dense-nomic / hybrid-nomic ndcg@10: the corpus vectors are the embedding "
                     f"cache's ({corpus.fingerprint()}-{enc.fingerprint}.npy), which the lent-GPU "
                     f"run built with this port on cuda (bench/gpu_models_ingest.py; its results "
                     f"give their min cosine to the CPU port's vectors); the queries were encoded "
                     f"here on the CPU.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--llm-n", type=int, default=None, help="HotpotQA questions (3 quick, 100)")
    ap.add_argument("--nomic-docs", type=int, default=100, help="docs timed for nomic's cost")
    ap.add_argument("--nomic-max-min", type=float, default=45.0,
                    help="skip nomic's full SciFact encode when it projects over this many "
                         "minutes (unless its embeddings are cached)")
    ap.add_argument("--reuse-fp32", action="store_true",
                    help="fp32 MiniLM reference: nDCG from cached embeddings, build cost from "
                         "--cost-docs abstracts (a loaded machine cannot afford both encodes)")
    ap.add_argument("--cost-docs", type=int, default=200)
    ap.add_argument("--encoder-threads", type=int, default=2,
                    help="encoder threads ($RAGPILOT_ENCODER_THREADS and torch's pool)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--contexts", nargs="+", choices=("hybrid", "gold"), default=["hybrid"],
                    help="generator contexts: the default hybrid k=5 retrieval and/or the gold "
                         "paragraphs (rows <label>@gold)")
    ap.add_argument("--threads", type=int, default=None,
                    help="llama.cpp threads (else $RAGPILOT_LLAMA_THREADS, else 1)")
    ap.add_argument("--budget-min", type=float, default=None,
                    help="start no new question after this many minutes of generation")
    ap.add_argument("--rerank-queries", type=int, default=20)
    ap.add_argument("--rerank-depth", type=int, default=20, help="BM25 candidates per query")
    ap.add_argument("--rerank-threads", type=int, default=1,
                    help="threads per cross-encoder runtime in the rerank section")
    ap.add_argument("--only", choices=("encoders", "retrieval", "generators", "nomic", "rerank"),
                    default=None,
                    help="one section (encoders = retrieval: the SciFact encoder rows; nomic: "
                         "only nomic's rows, e.g. from vectors a GPU run put in the embedding "
                         "cache), written to models.<section>.json")
    ap.add_argument("--no-nomic", action="store_true",
                    help="no nomic rows (minutes), written to models.no-nomic.json (or "
                         "models.<section>.json)")
    args = ap.parse_args()
    args.only = "retrieval" if args.only == "encoders" else args.only
    args.llm_n = args.llm_n or (3 if args.quick else 100)
    os.environ.setdefault(THREADS_ENV, str(args.encoder_threads))
    import torch

    torch.set_num_threads(args.encoder_threads)  # the fp32 sentence-transformers reference
    rows: list[dict] = []
    notes: list[str] = []
    sections = [s for s in ("retrieval", "generators", "rerank") if args.only in (None, s)]
    if args.only == "nomic":
        sections = ["retrieval"]
        corpus, test_qs, qrels, train_qs, train_qrels, ds = scifact(args.quick, args.seed)
        nomic_section(args, corpus, test_qs, qrels, train_qs, train_qrels, ds, rows, notes)
    elif "retrieval" in sections:
        retrieval_section(args, rows, notes)
    if "generators" in sections:
        generator_section(args, rows, notes)
    if "rerank" in sections:
        from bench.models_rerank import rerank_section

        rerank_section(args, rows, notes, scifact)
    md = ["| dataset | system | metric | value | 95% CI | n |", "|---|---|---|---|---|---|"]
    for r in rows:
        ci = f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]" if r["ci_low"] is not None else ""
        md.append(f"| {r['dataset']} | {r['system']} | {r['metric']} | {r['value']:.4g} | {ci} "
                  f"| {r['n']} |")
    md += [""] + [f"- {n}" for n in notes]
    datasets = {}
    if "retrieval" in sections or "rerank" in sections:
        datasets["scifact"] = data_root() / "scifact"
    if "generators" in sections:
        datasets["hotpotqa"] = data_root() / HOTPOT
    extra = {"quick": args.quick, "sections_run": sections, "llm_n": args.llm_n,
             "nomic_docs": args.nomic_docs, "encoder_threads": args.encoder_threads,
             "notes": notes}
    if "generators" in sections:
        extra["generators"] = {"contexts": args.contexts, "prompt": "cite_concise",
                               "shots": "zero-shot", "max_new_tokens": args.max_new_tokens,
                               "llama_threads": args.threads, "runtime": "llama.cpp",
                               "budget_min": args.budget_min}
    write_results("models" if args.only is None and not args.no_nomic
                  else f"models.{args.only or 'no-nomic'}", rows, make_meta(args.seed, datasets, extra=extra),
                  md_title="Stronger and faster models", md_body="\n".join(md))


if __name__ == "__main__":
    main()
