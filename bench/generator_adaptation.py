"""Issue 21 benchmark: a Qwen pairwise judge, GRPO of SmolLM2 from the SFT policy, and (when
teacher data exists) the distilled SmolLM2, on HotpotQA test questions.

    python bench/generator_adaptation.py --section judge --judge-minutes 20   # Qwen judge
    python bench/generator_adaptation.py --section grpo --sft DIR --grpo DIR  # eval both
    python bench/generator_adaptation.py --section render                     # json + md
    python bench/generator_adaptation.py --quick                              # < 2 min

Sections write parts under <cache>/bench/generator_adaptation/ (resumable: judge replies sit in
the judge cache, answers in the generation cache), `render` assembles
bench/results/generator_adaptation.{json,md}. Run each section at nice 10 with one thread.

judge: pairs = (Qwen2.5-Coder-1.5B answer, SmolLM2-135M answer) per HotpotQA test question,
  both from bench/models_generators.py's answer log (hybrid k=5 contexts, cite_concise);
  identical answer strings are skipped. The judge (Qwen on llama.cpp, one thread) sees the
  question and the two answers (no passages: 5 passages cost ~700 prompt tokens = ~50 s per
  call here) and runs both orders; pairs are judged in question order until --judge-minutes.
grpo: the SFT and the GRPO merged models (format hf, served by rag.generation.local) answer the
  first --eval-n test questions with the default hybrid retrieval's top 5; answer F1 against
  gold, paired bootstrap of grpo - sft.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag.env import configure_runtime_env  # noqa: E402

configure_runtime_env()

from bench.common import make_meta, metric_row, plain_row, write_results  # noqa: E402
from rag.generation.parse import parse_output  # noqa: E402
from rag.metrics.qa import best_em_f1  # noqa: E402
from rag.models import cache_dir  # noqa: E402

PARTS = cache_dir() / "bench" / "generator_adaptation"
QWEN, SMOL = "qwen2.5-coder-1.5b", "smollm2-135m"
TEACHER_S_PER_ANSWER = 37.0  # Qwen, hybrid k=5, one llama thread (bench/models_generators.py)


def _part(name: str, quick: bool) -> Path:
    return PARTS / f"{name}{'.quick' if quick else ''}.json"


# ---------------------------------------------------------------------------- judge
def answer_pairs(n: int) -> list[dict]:
    """(question, gold answers, Qwen answer, SmolLM2 answer, their F1) for the first `n` test
    questions present in the answer log, identical answers dropped."""
    from bench.models_generators import ANSWER_LOG, AnswerLog, hotpot_test

    log = AnswerLog(cache_dir() / "bench" / ANSWER_LOG)
    _, _, test = hotpot_test(n)
    out = []
    for e in test:
        recs = {lab: log.records.get(f"{lab}|hybrid|cite_concise|32|{e.id}")
                for lab in (QWEN, SMOL)}
        if not all(recs.values()):
            continue
        texts = {lab: parse_output(r["text"], 5, True, e.question)[0] for lab, r in recs.items()}
        if texts[QWEN].strip().lower() == texts[SMOL].strip().lower():
            continue
        out.append({"id": e.id, "question": e.question, "answers": list(e.answers),
                    "a": texts[QWEN], "b": texts[SMOL],
                    "f1_a": best_em_f1(texts[QWEN], e.answers)[1],
                    "f1_b": best_em_f1(texts[SMOL], e.answers)[1]})
    return out


def run_judge(minutes: float, quick: bool, judge_model: str, with_contexts: bool,
              max_pairs: int | None = None) -> dict:
    """Judge pairs in question order for at most `minutes` (wall); part `judge` or
    `judge-ctx` (passages shown: the top-5 hybrid contexts the answers were generated from)."""
    from rag.generation.factory import make_generator
    from rag.metrics.judge import PairwiseJudge
    from rag.metrics.pairwise_judge import ChatLMJudgeBackend, judge_stats, llama_chat

    pairs = answer_pairs(8 if quick else 100)
    ctx: dict = {}
    if with_contexts:
        from bench.models_generators import hotpot_test, hybrid_contexts

        _, data, test = hotpot_test(8 if quick else 100)
        ctx = {k: v[1] for k, v in hybrid_contexts(data, test).items()}
    gen = make_generator(judge_model, cache=False)
    backend = ChatLMJudgeBackend(llama_chat(gen), gen.fingerprint, name=f"judge:{judge_model}",
                                 with_contexts=with_contexts)
    judge = PairwiseJudge(backend)
    t0, done = time.perf_counter(), []
    for p in pairs:
        if time.perf_counter() - t0 > 60 * minutes or len(done) == max_pairs:
            break
        r = judge.compare(p["question"], ctx.get(p["id"], ()), p["a"], p["b"])
        done.append({**p, **r.to_dict()})
        print(f"[judge] {len(done)}/{len(pairs)} {r.forward}/{r.backward} -> {r.winner} "
              f"f1 {p['f1_a']:.2f}/{p['f1_b']:.2f} ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    from rag.metrics.judge import JudgeResult

    res = [JudgeResult(d["winner"], d["forward"], d["backward"], d["flipped"], d["margin"])
           for d in done]
    stats = judge_stats(res, [d["f1_a"] for d in done], [d["f1_b"] for d in done])
    part = {"judge_model": judge_model, "pairs": done, "stats": stats,
            "n_available": len(pairs), "seconds_per_call": backend.seconds + backend.replayed_seconds,
            "cache_hits": backend.cache_hits, "parse_failures": backend.parse_failures,
            "minutes": minutes, "with_contexts": with_contexts}
    _write(_part("judge-ctx" if with_contexts else "judge", quick), part)
    return part


# ---------------------------------------------------------------------------- grpo eval
def eval_generators(models: dict[str, Path], n: int, max_new_tokens: int = 16) -> dict:
    """{label: per-question answer F1} of merged HF models on the first `n` test questions
    with hybrid k=5 contexts (cached generations)."""
    from bench.models_generators import hotpot_test, hybrid_contexts
    from rag.generation.local import TransformersGenerator
    from rag.models import ModelSpec

    _, data, test = hotpot_test(n)
    ctx = hybrid_contexts(data, test)
    out: dict = {"ids": [e.id for e in test], "f1": {}, "seconds": {}}
    for label, path in models.items():
        spec = ModelSpec(label, "generator", "hf", path=str(path))
        gen = TransformersGenerator(spec, batch_size=4)
        t0 = time.perf_counter()
        gens = gen.generate_batch([e.question for e in test], [list(ctx[e.id][1]) for e in test],
                                  "cite_concise", max_new_tokens)
        out["seconds"][label] = time.perf_counter() - t0
        out["f1"][label] = [best_em_f1(g.text, e.answers)[1] for g, e in zip(gens, test,
                                                                            strict=True)]
        print(f"[eval] {label}: F1 {np.mean(out['f1'][label]):.3f} on {len(test)} "
              f"({out['seconds'][label]:.0f} s)", flush=True)
    return out


def _judge_rows(part: dict, system: str, dataset: str) -> list[dict]:
    pairs = part["pairs"]
    same = [float(d["forward"] != d["backward"] and "tie" not in (d["forward"], d["backward"]))
            for d in pairs]
    ties = [float(d["winner"] == "tie") for d in pairs]
    differ = [d for d in pairs if abs(d["f1_a"] - d["f1_b"]) > 1e-9]
    agree = [float(d["winner"] == ("A" if d["f1_a"] > d["f1_b"] else "B")) for d in differ]
    decisive = [a for a, d in zip(agree, differ, strict=True) if d["winner"] != "tie"]
    secs = part["seconds_per_call"]
    timing = PARTS / "judge-timing.json"
    if not secs and timing.exists():  # replayed from the cache: the runs' logged wall time
        t = json.loads(timing.read_text())
        secs = [t["run1_s_per_call"]] * (2 * t["run1_pairs"]) + \
            [t["run2_s_per_call"]] * (2 * t["run2_pairs"])
    return [metric_row(dataset, system, "position_bias", same),
            metric_row(dataset, system, "tie_rate", ties),
            metric_row(dataset, system, "agreement_with_f1_preference", agree),
            metric_row(dataset, system, "agreement_decisive", decisive),
            plain_row(dataset, system, "seconds_per_judgment", float(np.mean(secs)) if secs
                      else float("nan"), len(secs))]


def render(quick: bool) -> None:
    """bench/results/generator_adaptation.{json,md} from the parts that exist."""
    from rag.corpus.loaders import data_root

    rows, md = [], []
    ds = "hotpotqa/test[:100]/hybrid-k5"
    for name, system, shown in (("judge", "judge:qwen", "question + the two answers"),
                                ("judge-ctx", "judge:qwen+passages",
                                 "question + the 5 hybrid passages (400 chars each) + answers")):
        f = _part(name, quick)
        if not f.exists():
            md.append(f"- `{system}`: not run.")
            continue
        part = json.loads(f.read_text())
        jr = _judge_rows(part, system, f"{ds}/answer-pairs")
        rows += jr
        st = part["stats"]
        md += [f"### `{system}` (Qwen2.5-Coder-1.5B Q4_K_M, llama.cpp, 1 thread)", "",
               f"Shown: {shown}. Pairs: (Qwen answer, SmolLM2 answer) per test question, "
               f"{int(st['n_pairs'])} judged (in question order) of {part['n_available']} with "
               f"different answer strings; {int(st['n_f1_differ'])} pairs "
               f"have different gold F1. Both orders asked; disagreement = tie. Parse "
               f"failures {part['parse_failures']}, cache hits {part['cache_hits']}.", "",
               "| metric | value | 95% CI | n |", "|---|---|---|---|"]
        md += [f"| {r['metric']} | {r['value']:.3f} | " + (
            f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]" if r["ci_low"] is not None else "-")
            + f" | {r['n']} |" for r in jr]
        timing = PARTS / "judge-timing.json"
        if name == "judge" and timing.exists():
            t = json.loads(timing.read_text())
            quiet = t["uncontended_first_3_pairs_s_per_call"]
            lo, hi = min(quiet), max(quiet)
            md += ["", f"Seconds per judgment (one order): {lo:.1f}-{hi:.1f} s on a quiet machine "
                   f"(first 3 pairs), {t['run1_s_per_call']:.1f} s over the first "
                   f"{t['run1_pairs']} pairs and {t['run2_s_per_call']:.1f} s over the next "
                   f"{t['run2_pairs']} (load average {t['load_average_during_runs']}); that "
                   "run was stopped to leave the cores to GRPO, and a later run (cached pairs "
                   "replayed) judged the rest: the seconds_per_judgment row is that last run's "
                   "uncached calls."]
        md.append("")
    f = _part("grpo", quick)
    if f.exists():
        part = json.loads(f.read_text())
        sft, grpo = (np.asarray(part["f1"][k]) for k in ("smollm2-sft", "smollm2-grpo"))
        n = len(sft)
        d = f"hotpotqa/test[:{n}]/hybrid-k5"
        gr = [metric_row(d, "smollm2-sft", "answer_f1", sft),
              metric_row(d, "smollm2-grpo", "answer_f1", grpo),
              metric_row(d, "smollm2-grpo - smollm2-sft", "delta_answer_f1", grpo - sft)]
        rows += gr
        md += ["### GRPO vs SFT, end to end (hybrid k=5, cite_concise, greedy, 16 new tokens)",
               "", "| system | metric | value | 95% CI (paired bootstrap for the delta) | n |",
               "|---|---|---|---|---|"]
        md += [f"| {r['system']} | {r['metric']} | {r['value']:+.3f} | "
               f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['n']} |" for r in gr]
        changed = int(np.sum(grpo != sft))
        dr = gr[2]
        met = dr["ci_low"] > 0 and dr["value"] >= 0.02 and n >= 100
        md += ["", f"The F1 differs on {changed} of {n} questions. Acceptance (CI above 0, "
               f"+0.02 targeted, >= 100 questions): {'met' if met else 'missed'} (delta "
               f"{dr['value']:+.3f} [{dr['ci_low']:+.3f}, {dr['ci_high']:+.3f}], short of "
               f"+0.02 by {max(0.0, 0.02 - dr['value']):.3f}"
               + (f"; n {n} short of 100" if n < 100 else "") + "). The SFT policy is a "
               "25-step LoRA SFT (100 train questions, valid F1 0.436 on 16), registered as "
               "`smollm2-adapted@v1`; the GRPO model is `smollm2-adapted@v2` (no valid-F1 "
               "score: `@best` stays v1)."]
        t = part.get("train", {})
        st = t.get("settings") or {}
        md += ["", f"Training (TRL GRPOTrainer, CPU, one torch thread, nice 10 on the shared "
               f"2-core machine): SmolLM2 SFT policy + fresh LoRA r={st.get('lora_r')}, "
               f"{t.get('steps_done')} steps x {st.get('prompts_per_step')} HotpotQA train "
               f"prompt(s) x {st.get('num_generations')} samples, gold paragraphs "
               f"({st.get('max_context_chars')} chars), {st.get('max_completion_length')} new "
               f"tokens, lr {st.get('lr')}, beta {st.get('beta')}, reward = F1 + "
               f"{st.get('cite_weight')} x citation precision; {t.get('seconds', 0):.0f} s; "
               f"mean reward per step {t.get('reward_by_step')}; KL at the last step "
               f"{t.get('kl_last')}.", ""]
    else:
        md.append("- GRPO vs SFT: not run.")
    md += ["### smollm2-distilled", "",
           "Not run: the distillation set needs teacher answers for >= 500 HotpotQA train "
           "questions in two context modes (gold, hybrid) = 1000 Qwen answers at ~"
           f"{TEACHER_S_PER_ANSWER:.0f} s each = {1000 * TEACHER_S_PER_ANSWER / 3600:.1f} h on "
           f"one llama thread ({500 * TEACHER_S_PER_ANSWER / 3600:.1f} h with both cores as two "
           "Ray shards) on this 2-core machine. The code path is built and tested "
           "(rl.adaptation.teacher + sft_data.distillation_sets, SmolLM2 as a stand-in teacher "
           "in tests/test_teacher_data.py): `python -m rl.adaptation.teacher --mode gold --n 500 "
           "--shards 2`, then `ragpilot train-generator sft --train-jsonl <set>`.", ""]
    meta = make_meta(0, {"hotpotqa": data_root() / "hotpotqa"}, {"quick": quick})
    write_results("generator_adaptation", rows, meta,
                  "Generator adaptation with a real teacher (issue 21)", "\n".join(md))


def _write(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=str) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--section", choices=["judge", "judge-ctx", "grpo", "render"],
                    default="render")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--judge-model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--judge-minutes", type=float, default=20.0)
    ap.add_argument("--judge-max-pairs", type=int,
                    help="stop after N pairs (e.g. replay a killed run's cached pairs)")
    ap.add_argument("--sft", type=Path, help="merged SFT model folder")
    ap.add_argument("--grpo", type=Path, help="merged GRPO model folder")
    ap.add_argument("--eval-n", type=int, default=100)
    args = ap.parse_args()
    if args.section in ("judge", "judge-ctx"):
        run_judge(1.0 if args.quick else args.judge_minutes, args.quick, args.judge_model,
                  args.section == "judge-ctx", args.judge_max_pairs)
    elif args.section == "grpo":
        part = eval_generators({"smollm2-sft": args.sft, "smollm2-grpo": args.grpo},
                               4 if args.quick else args.eval_n)
        meta = args.grpo.parent / "adapter" / "meta.json"
        if meta.exists():
            m = json.loads(meta.read_text())
            part["train"] = {k: m.get(k) for k in ("steps_done", "seconds", "reward_first",
                                                   "reward_last", "reward_mean_last10", "eval")}
            part["train"]["settings"] = m.get("settings")
        log = args.grpo.parent / "train_log.jsonl"
        if log.exists():  # per-step rows survive a stop-and-finalise (meta's seconds do not)
            steps = [json.loads(x) for x in log.read_text().splitlines() if '"reward"' in x]
            part.setdefault("train", {}).update(
                steps_done=len(steps), seconds=sum(r.get("step_time", 0.0) for r in steps),
                reward_by_step=[round(r["reward"], 3) for r in steps],
                kl_last=steps[-1].get("kl") if steps else None)
        _write(_part("grpo", args.quick), part)
    else:
        render(args.quick)


if __name__ == "__main__":
    main()
