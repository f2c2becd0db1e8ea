"""End-to-end QA benchmark on HotpotQA distractor (pooled corpus of all 1,100 examples).

    python bench/qa.py           # full: test split (300 questions), every retrieval variant
    python bench/qa.py --quick   # < 2 min: 40 test questions, fewer systems

Every question retrieves over the pooled paragraphs of all examples (~9.7k passages), not only
its own 10. Rows (test split of configs/splits/hotpotqa.json):
  * retrieval x rerank with the extractive reader: em, f1, sp_f1 (titles of cited passages vs
    gold titles), recall@2/5/10 of gold titles, context redundancy;
  * the generator ceiling: every generator backend on the GOLD paragraphs (oracle retrieval);
  * end to end with SmolLM2 on the best retrieval config;
  * p50/p95 latency per stage for the default config.
Writes bench/results/qa.json and bench/results/qa.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import make_meta, metric_row, parser, write_results  # noqa: E402
from rag.config import RAGConfig  # noqa: E402
from rag.corpus.hygiene import load_split  # noqa: E402
from rag.corpus.loaders import data_root, load_hotpotqa  # noqa: E402
from rag.evaluate import evaluate, latency_summary  # noqa: E402
from rag.indexset import IndexSet  # noqa: E402
from rag.metrics import score_answer  # noqa: E402
from rag.models import cache_dir  # noqa: E402
from rag.pipeline import Pipeline  # noqa: E402
from rag.types import Answer, Hit  # noqa: E402

QA_METRICS = ("em", "f1", "sp_f1", "recall@2", "recall@5", "recall@10", "redundancy")
LLM = "smollm2-135m-instruct"
LLM_N = 100
"""Test questions the SmolLM2 rows answer (12 with --quick): a CPU generator is slow."""


def add_rows(rows, table, ds, system, scored, seed, metrics=QA_METRICS):
    line = {"system": system}
    for m in metrics:
        vals = [r[m] for r in scored if m in r]
        if vals:
            rows.append(metric_row(ds, system, m, vals, seed=seed))
            line[m] = float(np.mean(vals))
    table.append(line)
    print(f"{system:<40} " + " ".join(f"{k} {v:.3f}" for k, v in line.items() if k != "system"),
          flush=True)


def oracle_answers(pipe: Pipeline, examples, prompt_id: str, max_new_tokens: int):
    """Answers generated from the gold paragraphs only (oracle retrieval)."""
    gen = pipe.resources.generator(pipe.config.generator)
    ctxs = [pipe.contexts([Hit(1.0, pid) for pid in e.gold_passage_ids]) for e in examples]
    t0 = time.perf_counter()
    gens = gen.generate_batch([e.question for e in examples], ctxs, prompt_id,
                              max_new_tokens=max_new_tokens)
    per_q = (time.perf_counter() - t0) * 1000 / max(len(examples), 1)
    return [Answer(e.id, e.question, g.text, g.citations, c, (), {"generate": per_q},
                   g.tokens_in, g.tokens_out, pipe.config.config_hash, g.raw)
            for e, c, g in zip(examples, ctxs, gens, strict=True)], per_q


def main() -> None:
    args = parser(__doc__, seed=True).parse_args()

    path = data_root() / "hotpotqa" / "hotpot_dev_distractor_1100.jsonl"
    ds = load_hotpotqa(path, pooled=True)
    test_ids = set(load_split("hotpotqa").ids("test"))
    test = [e for e in ds.examples if e.id in test_ids]
    llm_n = 12 if args.quick else LLM_N
    if args.quick:
        test = test[:40]
    root = cache_dir() / "bench" / f"hotpotqa-{ds.corpus.fingerprint()}"
    idx = IndexSet.open(root) if (root / "corpus.jsonl").exists() else IndexSet.create(
        ds.corpus, root, manifest={"dataset": "hotpotqa"})
    idx.show_progress = True
    base = RAGConfig(k=5, n_candidates=50, generator="extractive", prompt_id="cite_concise")
    pipe = Pipeline(idx, base)
    name = "hotpotqa/test" + ("[:40]" if args.quick else "")
    rows, table = [], []

    variants = [("bm25", base.replace(variant="bm25")), ("dense", base.replace(variant="dense")),
                ("hybrid", base.replace(variant="hybrid")),
                ("graph", base.replace(variant="graph"))]
    best_sys, best_f1 = None, -1.0
    for vname, cfg in variants:
        for rerank in ("none", "cosine"):
            c = cfg.replace(rerank=rerank)
            res = evaluate(pipe.with_config(c), test)
            sysname = f"{vname}{'+cosine' if rerank != 'none' else ''}/extractive"
            add_rows(rows, table, name, sysname, res.rows, args.seed)
            if res.summary["f1"] > best_f1:
                best_sys, best_f1 = c, res.summary["f1"]
            if c == base.replace(variant="hybrid"):
                lat = latency_summary(res.answers)

    # generator ceiling: gold paragraphs as the only context
    ceiling_ex = test
    ans, per_q = oracle_answers(pipe, ceiling_ex, "cite_concise", 48)
    add_rows(rows, table, name, "oracle/extractive", [score_answer(a, e, k=5) for a, e in
                                                        zip(ans, ceiling_ex, strict=True)],
             args.seed, metrics=("em", "f1", "sp_f1"))
    llm_pipe = pipe.with_config(base.replace(generator=LLM, max_new_tokens=24))
    for prompt in ("cite_concise", "plain"):
        ans, per_q_llm = oracle_answers(llm_pipe, test[:llm_n], prompt, 24)
        add_rows(rows, table, name, f"oracle/{LLM}/{prompt}",
                 [score_answer(a, e, k=5) for a, e in zip(ans, test[:llm_n], strict=True)],
                 args.seed, metrics=("em", "f1", "sp_f1"))
        rows.append({"dataset": name, "system": f"oracle/{LLM}/{prompt}",
                     "metric": "generate_ms_per_q", "value": per_q_llm, "ci_low": None,
                     "ci_high": None, "n": llm_n})

    # end to end with the LLM on the best retrieval config (by extractive F1)
    e2e = evaluate(pipe.with_config(best_sys.replace(generator=LLM, max_new_tokens=24)),
                   test[:llm_n])
    add_rows(rows, table, name, f"{best_sys.variant}+{best_sys.rerank}/{LLM}", e2e.rows,
             args.seed)
    md_note = (f"Best retrieval config by extractive F1: {best_sys.variant} + rerank "
               f"{best_sys.rerank} (config {best_sys.config_hash}).")
    llm_lat = latency_summary(e2e.answers)
    llm_sys = f"{best_sys.variant}+{best_sys.rerank}/{LLM}"
    for sysname, lsum in (("hybrid/extractive", lat), (llm_sys, llm_lat)):
        for k, v in lsum.items():
            rows.append({"dataset": name, "system": sysname, "metric": k, "value": v,
                         "ci_low": None, "ci_high": None, "n": len(test)})

    md = ["| system | " + " | ".join(QA_METRICS) + " |", "|---" * (len(QA_METRICS) + 1) + "|"]
    md += ["| " + t["system"] + " | " + " | ".join(f"{t[m]:.3f}" if m in t else "—"
                                                   for m in QA_METRICS) + " |" for t in table]
    md += ["", "Latency per stage (ms) on this machine, k=5: the default config (hybrid, "
               "extractive reader) and the best retrieval config with SmolLM2 (batch 8; each "
               "batch's time split evenly over its questions):", "",
           "| system | stage | p50 | p95 |", "|---|---|---|---|"]
    for sysname, lsum in (("hybrid/extractive", lat), (llm_sys, llm_lat)):
        for stage in sorted({k.rsplit("_p", 1)[0] for k in lsum}):
            md.append(f"| {sysname} | {stage} | {lsum[stage + '_p50_ms']:.1f} | "
                      f"{lsum[stage + '_p95_ms']:.1f} |")
    md += ["", f"LLM rows use the first {llm_n} test questions; the others all {len(test)}. "
           + md_note, "", "`oracle/*` rows answer from the two gold paragraphs only (the "
           "generator ceiling); the others retrieve over all ~10.8k pooled paragraphs. sp_f1 = "
           "titles of cited passages vs gold titles; recall@n = gold paragraphs among the top n "
           "candidates."]
    write_results("qa", rows, make_meta(args.seed, {"hotpotqa": path}, extra={
        "quick": args.quick, "corpus_passages": len(ds.corpus), "questions": len(test),
        "llm_questions": llm_n}), md_title="QA on HotpotQA distractor (pooled corpus)",
        md_body="\n".join(md))


if __name__ == "__main__":
    main()
