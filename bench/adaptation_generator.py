"""Generator adaptation benchmark: LoRA SFT and DPO of SmolLM2-135M-Instruct vs the base model,
and fp32 vs int8 inference of the SFT model, on CPU.

    python bench/adaptation_generator.py           # full: ~1-2 h on 2 busy shared cores
    python bench/adaptation_generator.py --quick   # < 2 min: tiny train/eval, shows it runs

Protocol (HotpotQA distractor, configs/splits/hotpotqa.json):
  * SFT data: the first --n-train questions of the TRAIN split: 2 gold paragraphs + 1 distractor,
    shuffled, each trimmed to --ctx-chars around its supporting sentences; target `<answer> [i][j]`.
  * LoRA r=8 on q/k/v/o (configs/rl/generator_sft.yaml), one epoch; `best` checkpoint by answer F1
    on 16 VALID questions; tokens/s = real tokens through forward+backward / training seconds.
  * DPO (TRL, sigmoid loss) on the merged SFT model: pairs for --dpo-pairs train questions,
    chosen = gold-format answer, rejected = the SFT model's own worse answer (ranker: F1 +
    citation precision, or the learned reward model when present).
  * Evaluation on the first --n-eval TEST questions with their two gold paragraphs (whole, no
    distractor: the generator ceiling of bench/qa.py), every model served through
    `rag.generation.factory.make_generator` (trained ones via a registry entry, format hf):
    answer F1/EM, citation precision/recall (cited vs gold passages), faithfulness
    (QualityScorer); paired bootstrap CI of each model minus base.
  * Quantisation: the merged SFT model in fp32 and dynamic int8, each in its own process, batch 1:
    ms per generated token, peak RSS, F1 on --quant-n test questions. bitsandbytes 8/4-bit: GPU
    only, reported as not run when no GPU is visible.
Writes bench/results/adaptation_generator.json + .md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag.env import configure_runtime_env  # noqa: E402

configure_runtime_env()

from bench.common import make_meta, metric_row, plain_row, write_results  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rag.generation.factory import make_generator  # noqa: E402
from rag.metrics.qa import best_em_f1  # noqa: E402
from rag.models import ModelRegistry, cache_dir  # noqa: E402
from rag.types import Answer  # noqa: E402
from rl.adaptation.generator_config import GeneratorSFTConfig  # noqa: E402
from rl.adaptation.generator_export import merge_adapter, write_registry_entry  # noqa: E402
from rl.adaptation.generator_model import load_base_model, load_tokenizer, resolve_base  # noqa: E402
from rl.adaptation.generator_trainer import SFTRun, alias_path  # noqa: E402
from rl.adaptation.prefs import build_pairs, make_ranker, save_pairs, train_preferences  # noqa: E402
from rl.adaptation.quant import measure_in_subprocess  # noqa: E402
from rl.adaptation.sft_data import hotpot_split, save_examples  # noqa: E402
from rl.stats.bootstrap import paired_bootstrap  # noqa: E402

BASE = "smollm2-135m-instruct"
METRICS = ("f1", "em", "citation_precision", "citation_recall", "faithfulness")


def score(examples, gens, scorer) -> list[dict[str, float]]:
    answers = [Answer(e.id, e.question, g.text, g.citations, e.contexts, (), {}, g.tokens_in,
                      g.tokens_out, "", g.raw) for e, g in zip(examples, gens, strict=True)]
    quality = scorer.score_batch(answers)
    rows = []
    for e, g, q in zip(examples, gens, quality, strict=True):
        em, f1, _, _ = best_em_f1(g.text, e.answers)
        cited, gold = set(g.citations), set(e.gold_positions)
        row = {"f1": f1, "em": em,
               "citation_precision": len(cited & gold) / len(cited) if cited else 0.0,
               "citation_recall": len(cited & gold) / len(gold) if gold else 0.0}
        if "faithfulness" in q:
            row["faithfulness"] = q["faithfulness"]
        rows.append(row)
    return rows


def evaluate_generator(name: str, registry: ModelRegistry, examples, prompt_id: str,
                       max_new_tokens: int, scorer):
    gen = make_generator(name, registry=registry, cache=False)
    t0 = time.perf_counter()
    gens = gen.generate_batch([e.question for e in examples], [list(e.contexts) for e in examples],
                              prompt_id, max_new_tokens=max_new_tokens)
    secs = time.perf_counter() - t0
    del gen
    return score(examples, gens, scorer), secs, [g.raw for g in gens]


E2E_MARK = "## End to end: hybrid retrieval (k = 5) + each generator"


def e2e_examples(test, k: int = 5):
    """The same test questions with the contexts the default retrieval returns (hybrid, top-k
    of the pooled HotpotQA corpus) instead of the gold paragraphs; `gold_positions` = the
    positions of gold paragraphs among them (what citation precision/recall compare with)."""
    from dataclasses import replace

    from rag.config import RAGConfig
    from rag.pipeline import Pipeline
    from rl.common.data import TuningData

    data = TuningData.open("hotpotqa")
    gold = {e.id: set(e.gold_passage_ids) for e in data.dataset.examples}
    pipe = Pipeline(data.indexes, RAGConfig(variant="hybrid", k=k, generator="extractive"))
    out, recall = [], []
    for e in test:
        _, ctxs, _ = pipe.retrieve(e.question)  # (all candidates, the k contexts, latency)
        ids = [c.id for c in ctxs]
        g = gold.get(e.id, set())
        pos = tuple(i + 1 for i, pid in enumerate(ids) if pid in g)
        recall.append(len(set(ids) & g) / len(g) if g else 0.0)
        out.append(replace(e, contexts=tuple(ctxs), gold_positions=pos))
    return out, recall


def section_e2e(test, registry, systems, args, scorer, prompt_id: str):
    """(rows, markdown lines): every generator on retrieved contexts, paired vs base."""
    ex, recall = e2e_examples(test)
    ds = f"hotpotqa/test[:{len(ex)}] hybrid k=5"
    rows = [metric_row(ds, "hybrid", "recall@5", recall, seed=args.seed)]
    per: dict[str, list[dict[str, float]]] = {}
    for name, label in systems:
        res, secs, _ = evaluate_generator(name, registry, ex, prompt_id, args.max_new_tokens,
                                          scorer)
        per[label] = res
        for met in METRICS:
            vals = [r[met] for r in res if met in r]
            if vals:
                rows.append(metric_row(ds, label, met, vals, seed=args.seed))
        rows.append(plain_row(ds, label, "generate_ms_per_q", 1000 * secs / len(ex), len(ex)))
        print(f"[bench] e2e {label}: f1 {np.mean([r['f1'] for r in res]):.3f}", flush=True)
    md = [E2E_MARK, "", f"The same {len(ex)} test questions, contexts retrieved by the default "
          f"hybrid retrieval over all ~10.8k pooled paragraphs (gold-paragraph recall@5 "
          f"{np.mean(recall):.3f}); citations are scored against the gold paragraphs among "
          "them.", "", "| system | " + " | ".join(METRICS) + " |",
          "|---" * (len(METRICS) + 1) + "|"]
    ci = {(r["system"], r["metric"]): r for r in rows}
    for _, label in systems:
        cells = [f"{ci[(label, m)]['value']:.3f} [{ci[(label, m)]['ci_low']:.3f}, "
                 f"{ci[(label, m)]['ci_high']:.3f}]" if (label, m) in ci else "—"
                 for m in METRICS]
        md.append(f"| {label} | " + " | ".join(cells) + " |")
    md += ["", "| comparison | metric | Δ | 95% CI | p |", "|---|---|---|---|---|"]
    for label in per:
        if label == "base":
            continue
        for met in ("f1", "citation_precision"):
            bs = paired_bootstrap([r[met] for r in per["base"]], [r[met] for r in per[label]],
                                  seed=args.seed)
            rows.append({"dataset": ds, "system": f"{label} - base", "metric": f"{met}_delta",
                         "value": bs.mean_diff, "ci_low": bs.ci_low, "ci_high": bs.ci_high,
                         "n": bs.n})
            md.append(f"| {label} − base | {met} | {bs.mean_diff:+.3f} | [{bs.ci_low:+.3f}, "
                      f"{bs.ci_high:+.3f}] | {bs.p_value:.4f} |")
    return rows, md


def only_e2e(args, out: Path) -> None:
    """Add the end-to-end section to the committed results, reusing the models a full run
    trained (they stay under the cache dir); refuses when there are none."""
    from rag.metrics.quality import QualityScorer

    reg_file = out / "models.yaml"
    res_json = Path(__file__).resolve().parent / "results" / "adaptation_generator.json"
    res_md = res_json.with_suffix(".md")
    if not reg_file.exists() or not res_json.exists():
        sys.exit(f"--only-e2e needs a full run first ({reg_file} and {res_json})")
    registry = ModelRegistry.from_yaml(reg_file)
    systems = [(BASE, "base")] + [(n, lbl) for n, lbl in (("smollm2-sft", "sft-lora-r8"),
                                                           ("smollm2-sft-dpo", "sft+dpo"))
                                  if n in registry.names("generator")]
    test = hotpot_split("test", args.n_eval)
    rows, md = section_e2e(test, registry, systems, args, QualityScorer(),
                           GeneratorSFTConfig.from_yaml().prompt_id)
    doc = json.loads(res_json.read_text())
    doc["rows"] = [r for r in doc["rows"] if "hybrid k=5" not in r["dataset"]] + rows
    from rag.provenance import code_commit

    doc["meta"]["e2e"] = {"commit": code_commit(), "note": "section added by --only-e2e with "
                          "the models of the full run above"}
    res_json.write_text(json.dumps(doc, indent=1) + "\n")
    text = res_md.read_text().split(E2E_MARK)[0].rstrip() + "\n\n" + "\n".join(md) + "\n"
    res_md.write_text(text)
    print(f"wrote {res_json} and {res_md}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-train", type=int, default=500)
    ap.add_argument("--ctx-chars", type=int, default=600)
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--n-eval", type=int, default=100)
    ap.add_argument("--dpo-pairs", type=int, default=64)
    ap.add_argument("--dpo-steps", type=int, default=32)
    ap.add_argument("--quant-n", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; 2 on a busy 2-core machine measured 5.7 tokens/s "
                         "(OpenMP threads wait on each other) vs ~40 with 1")
    ap.add_argument("--max-new-tokens", type=int, default=20)
    ap.add_argument("--only-e2e", action="store_true",
                    help="add the end-to-end section using the models of the last full run")
    args = ap.parse_args()
    if args.quick:
        args.n_train, args.n_eval, args.dpo_pairs, args.dpo_steps, args.quant_n = 8, 8, 4, 1, 3

    out = cache_dir() / "bench" / ("adaptation_generator" + (".quick" if args.quick else ""))
    if args.only_e2e:
        return only_e2e(args, out)
    if out.exists():
        shutil.rmtree(out)  # a benchmark starts clean (no resume from an older run)
    out.mkdir(parents=True)
    cfg = GeneratorSFTConfig.from_yaml().replace(**{
        "threads": args.threads, "train.seed": args.seed, "train.lr": args.lr,
        "data.n_train": args.n_train,
        "data.max_context_chars": args.ctx_chars, "eval.n": 4 if args.quick else 16,
        "eval.every_steps": 2 if args.quick else 25, "eval.max_new_tokens": args.max_new_tokens,
        "checkpoint.every_steps": 2 if args.quick else 10, "prefs.steps": args.dpo_steps,
        "prefs.n_pairs": args.dpo_pairs, "mlflow.dir": str(out / "mlflow")})
    if args.quick:
        cfg = cfg.replace(**{"train.max_steps": 2})
    base_path = resolve_base(BASE)
    train = hotpot_split("train", args.n_train, n_distractors=cfg.data.n_distractors,
                         max_context_chars=args.ctx_chars, seed=args.seed)
    valid = hotpot_split("valid", cfg.eval.n)
    test = hotpot_split("test", args.n_eval)
    save_examples(train, out / "train.jsonl")
    save_examples(test, out / "test.jsonl")
    ds_name = f"hotpotqa/test[:{len(test)}] gold paragraphs"
    rows: list[dict] = []
    notes: dict = {}

    # ---- SFT ---------------------------------------------------------------------------
    t0 = time.perf_counter()
    run = SFTRun(cfg, out / "sft", train, valid, base_path=base_path,
                 log=lambda m: print(m, flush=True))
    s = run.train()
    sft_wall = time.perf_counter() - t0
    del run
    best = alias_path(out / "sft", "best") or alias_path(out / "sft", "latest")
    merged_sft = merge_adapter(best, out / "sft-merged")
    reg_file = write_registry_entry(out / "models.yaml", "smollm2-sft", merged_sft)
    print(f"[bench] SFT {s['steps_done']} steps, {s['tokens_per_s']:.0f} tok/s, best step "
          f"{s['best_step']} (valid F1 {s['best_eval_f1']:.3f})", flush=True)
    for k in ("tokens_per_s", "train_seconds", "steps_done", "tokens", "best_eval_f1",
              "final_loss", "skipped_examples"):
        rows.append(plain_row(f"hotpotqa/train[:{len(train)}]", "sft-lora-r8", f"sft_{k}",
                              float(s[k] or 0), len(train)))
    notes["sft"] = {**s, "wall_seconds": sft_wall}

    # ---- DPO on the SFT model -----------------------------------------------------------
    t0 = time.perf_counter()
    ranker_name, ranker = make_ranker(cfg.prefs.ranker)
    tok = load_tokenizer(merged_sft)
    model = load_base_model(merged_sft, cfg)
    pairs = build_pairs(model, tok, train[: args.dpo_pairs], cfg, ranker, n_samples=1)
    del model
    save_pairs(pairs, out / "dpo" / "pairs.jsonl")
    dpo_ok = bool(pairs)
    if dpo_ok:
        m = train_preferences("dpo", merged_sft, pairs, cfg, out / "dpo")
        merged_dpo = merge_adapter(out / "dpo" / "adapter", out / "dpo-merged",
                                   base_path=merged_sft)
        write_registry_entry(out / "models.yaml", "smollm2-sft-dpo", merged_dpo)
        notes["dpo"] = {**m, "pairs": len(pairs), "ranker": ranker_name,
                        "wall_seconds": time.perf_counter() - t0}
        for k in ("seconds", "train_loss", "first_loss", "last_loss", "rewards_accuracies",
                  "rewards_margins"):
            if m.get(k) is not None:
                rows.append(plain_row(f"hotpotqa/train[:{args.dpo_pairs}]", "sft+dpo",
                                      f"dpo_{k}", float(m[k]), len(pairs)))
    else:
        notes["dpo"] = {"pairs": 0, "note": "no pair: the SFT model matched gold everywhere"}
    print(f"[bench] DPO: {notes['dpo']}", flush=True)

    # ---- evaluation: base vs SFT vs DPO ------------------------------------------------------
    from rag.metrics.quality import QualityScorer

    scorer = QualityScorer()
    registry = ModelRegistry.from_yaml(reg_file)
    systems = [(BASE, "base"), ("smollm2-sft", "sft-lora-r8")]
    if dpo_ok:
        systems.append(("smollm2-sft-dpo", "sft+dpo"))
    per_sys: dict[str, list[dict[str, float]]] = {}
    table = []
    for name, label in systems:
        res, secs, raws = evaluate_generator(name, registry, test, cfg.prompt_id,
                                             args.max_new_tokens, scorer)
        per_sys[label] = res
        (out / f"answers-{label}.json").write_text(json.dumps(raws, indent=0))
        line = {"system": label}
        for met in METRICS:
            vals = [r[met] for r in res if met in r]
            if vals:
                rows.append(metric_row(ds_name, label, met, vals, seed=args.seed))
                line[met] = (float(np.mean(vals)), len(vals))
        rows.append(plain_row(ds_name, label, "generate_ms_per_q", 1000 * secs / len(test),
                              len(test)))
        table.append(line)
        print(f"[bench] {label}: " + " ".join(f"{k} {v[0]:.3f}" for k, v in line.items()
                                               if k != "system"), flush=True)
    deltas = []
    for label in per_sys:
        if label == "base":
            continue
        for met in ("f1", "em", "citation_recall"):
            a = [r[met] for r in per_sys["base"]]
            b = [r[met] for r in per_sys[label]]
            bs = paired_bootstrap(a, b, seed=args.seed)
            rows.append({"dataset": ds_name, "system": f"{label} - base", "metric":
                         f"{met}_delta", "value": bs.mean_diff, "ci_low": bs.ci_low,
                         "ci_high": bs.ci_high, "n": bs.n})
            deltas.append((label, met, bs))
    if "sft+dpo" in per_sys:
        a = [r["f1"] for r in per_sys["sft-lora-r8"]]
        b = [r["f1"] for r in per_sys["sft+dpo"]]
        bs = paired_bootstrap(a, b, seed=args.seed)
        rows.append({"dataset": ds_name, "system": "sft+dpo - sft-lora-r8", "metric": "f1_delta",
                     "value": bs.mean_diff, "ci_low": bs.ci_low, "ci_high": bs.ci_high,
                     "n": bs.n})
        deltas.append(("sft+dpo vs sft", "f1", bs))

    # ---- end to end: retrieved contexts -----------------------------------------------------
    e2e_rows, e2e_md = section_e2e(test, registry, systems, args, scorer, cfg.prompt_id)
    rows += e2e_rows

    # ---- quantised inference ---------------------------------------------------------------
    import torch

    qn = min(args.quant_n, len(test))
    quant = {}
    for mode in ("fp32", "int8"):
        quant[mode] = measure_in_subprocess(merged_sft, mode, out / "test.jsonl", cfg.prompt_id,
                                            out / f"quant-{mode}.json", args.max_new_tokens,
                                            limit=qn, threads=args.threads)
        qd = f"hotpotqa/test[:{qn}] gold paragraphs"
        rows.append(metric_row(qd, f"sft/{mode}", "f1", quant[mode]["f1"], seed=args.seed))
        for k in ("ms_per_token", "ms_per_answer", "peak_rss_mb", "rss_loaded_mb", "load_s"):
            rows.append(plain_row(qd, f"sft/{mode}", k, quant[mode][k], qn))
        print(f"[bench] {mode}: {quant[mode]['ms_per_token']:.1f} ms/token, peak "
              f"{quant[mode]['peak_rss_mb']:.0f} MiB", flush=True)
    agree = float(np.mean([a == b for a, b in zip(quant["fp32"]["answers"],
                                                  quant["int8"]["answers"], strict=True)]))
    rows.append(plain_row(f"hotpotqa/test[:{qn}] gold paragraphs", "sft/int8",
                          "same_answer_as_fp32", agree, qn))
    gpu = torch.cuda.is_available()
    notes["bitsandbytes"] = "run" if gpu else "not run: no GPU on this machine (bnb8/bnb4 " \
                                              "refuse CPU with ConfigError quant.mode)"

    # ---- markdown -----------------------------------------------------------------------------
    md = [f"Evaluation: first {len(test)} HotpotQA **test** questions, the two gold paragraphs "
          f"as the only contexts (whole paragraphs), prompt `{cfg.prompt_id}`, greedy, "
          f"max {args.max_new_tokens} new tokens. Mean [95% bootstrap CI]; faithfulness n "
          "excludes yes/no answers.", "",
          "| system | " + " | ".join(METRICS) + " |", "|---" * (len(METRICS) + 1) + "|"]
    ci = {(r["system"], r["metric"]): r for r in rows}
    for line in table:
        cells = []
        for met in METRICS:
            r = ci.get((line["system"], met))
            cells.append(f"{r['value']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
                         if r else "—")
        md.append(f"| {line['system']} | " + " | ".join(cells) + " |")
    md += ["", "Paired bootstrap (10k resamples) of the per-question difference:", "",
           "| comparison | metric | Δ | 95% CI | p |", "|---|---|---|---|---|"]
    for label, met, bs in deltas:
        cmp_ = label if " vs " in label else f"{label} − base"
        md.append(f"| {cmp_} | {met} | {bs.mean_diff:+.3f} | [{bs.ci_low:+.3f}, "
                  f"{bs.ci_high:+.3f}] | {bs.p_value:.4f} |")
    md += ["", f"Training (CPU, {args.threads} torch thread(s), this shared 2-core machine): SFT "
           f"on {len(train)} train questions (2 gold + {cfg.data.n_distractors} distractor, "
           f"{args.ctx_chars} chars each), LoRA r={cfg.lora.r} q/k/v/o, batch "
           f"{cfg.train.batch_size}, lr {cfg.train.lr}, {s['steps_done']} steps, "
           f"{s['tokens']} tokens in {s['train_seconds']:.0f} s = **{s['tokens_per_s']:.0f} "
           f"tokens/s**; best checkpoint step {s['best_step']} (valid F1 "
           f"{s['best_eval_f1']:.3f} on {len(valid)})."]
    if dpo_ok:
        d = notes["dpo"]
        md.append(f"DPO (TRL, beta {cfg.prefs.beta}, lr {cfg.prefs.lr}): {d['pairs']} pairs "
                  f"(ranker {ranker_name}), {d['steps']} steps in {d['seconds']:.0f} s; loss "
                  f"{d['first_loss']:.3f} → {d['last_loss']:.3f}, reward accuracy (last third) "
                  f"{d.get('rewards_accuracies', float('nan')):.2f}.")
    md += ["", f"Quantised inference of the SFT model (batch 1, {qn} questions, "
           f"{args.threads} thread(s), each mode in its own process):", "",
           "| mode | ms/token | ms/answer | RSS after load MiB | peak RSS MiB | F1 |",
           "|---|---|---|---|---|---|"]
    for mode, q in quant.items():
        md.append(f"| {mode} | {q['ms_per_token']:.1f} | {q['ms_per_answer']:.0f} | "
                  f"{q['rss_loaded_mb']:.0f} | {q['peak_rss_mb']:.0f} | "
                  f"{np.mean(q['f1']):.3f} |")
    md += ["", f"int8 gives the same answer string as fp32 on {agree:.0%} of the questions. "
           f"bitsandbytes 8/4-bit (GPU): {notes['bitsandbytes']}.", ""] + e2e_md
    write_results("adaptation_generator", rows, make_meta(args.seed, {
        "hotpotqa": data_root() / "hotpotqa" / "hotpot_dev_distractor_1100.jsonl"}, extra={
        "quick": args.quick, "base_model": BASE, "n_train": len(train), "n_eval": len(test),
        "config": cfg.model_dump(mode="json"), "notes": notes}),
        md_title="Generator adaptation: LoRA SFT, DPO, int8 (SmolLM2-135M-Instruct, CPU)",
        md_body="\n".join(md))


if __name__ == "__main__":
    main()
