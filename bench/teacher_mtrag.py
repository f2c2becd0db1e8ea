"""Teacher data for MTRAG (issue 21, item 1's "for MTRAG train tasks likewise"): Qwen2.5-Coder-1.5B
answers the answer-holding MTRAG train tasks over their gold passages; the answers are scored
against the reference answers and gold passages and filtered, and compared, on the same prompts,
with the student's base model (SmolLM2-135M-Instruct), so the teacher is shown to know more than
the student before anyone distils from it.

    python bench/teacher_mtrag.py              # every answer-holding train task (~45 min on 2 cores)
    python bench/teacher_mtrag.py --n 60       # the first 60
    python bench/teacher_mtrag.py --quick      # 2 tasks -> bench/results/teacher_mtrag.quick.*

Examples: `rl.adaptation.sft_data.mtrag_split` (train split of configs/splits/mtrag.json only;
last user turn; up to 2 gold passages + 1 gold passage of another conversation of the same
collection, shuffled, each cut at a sentence end to 700 characters). Prompt and filter:
`rl.adaptation.teacher.MODES["mtrag-gold"]` (`cite_long`, 96 new tokens; kept = cites
something, cites only gold passages, token F1 >= 0.3 against the reference answer).

The teacher runs as a Ray job of `--shards` tasks (one llama.cpp thread each) writing the
resumable teacher store; a re-run answers only what is missing, so `--budget-min` can cut a run
and the next one continues. Rows cover the tasks both models answered.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag.env import configure_runtime_env  # noqa: E402

configure_runtime_env()

from bench.common import make_meta, metric_row, write_results  # noqa: E402

MODE = "mtrag-gold"
TEACHER_LABEL, STUDENT_LABEL = "teacher:qwen", "base:smollm2-135m-instruct"
STUDENT = "smollm2-135m-instruct-llama"  # the same llama.cpp runtime and prompt as the teacher


def answer(model: str, exs: list, shards: int, budget_s: float | None) -> tuple[list, str]:
    """Records for `exs` in order, answered (Ray tasks when `shards` > 1) or read back from
    the teacher store, and the model's fingerprint; stops answering after `budget_s` (the rest
    is left for a re-run)."""
    from rag.generation.factory import make_generator
    from rl.adaptation.teacher import TeacherStore, mode_spec, run_teacher_job, teacher_answers

    spec = mode_spec(MODE)
    if shards > 1:
        run_teacher_job(model, MODE, len(exs), shards, budget_s)
        budget_s = 0.0  # read back only: whatever the job did not answer stays missing
    gen = make_generator(model, cache=False)
    recs = teacher_answers(gen, exs, MODE, prompt_id=spec.prompt_id,
                           max_new_tokens=spec.max_new_tokens, store=TeacherStore(),
                           budget_s=budget_s, log=lambda m: print(m, flush=True))
    return recs, gen.fingerprint or gen.name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, help="the first N answer-holding train tasks (all)")
    ap.add_argument("--shards", type=int, default=2, help="teacher Ray tasks (one thread each)")
    ap.add_argument("--budget-min", type=float, help="teacher generation budget per shard")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    for flag, v in (("--n", args.n), ("--shards", args.shards)):
        if v is not None and v < 1:
            ap.error(f"{flag} must be >= 1")

    from rag.corpus.loaders import data_root
    from rl.adaptation.sft_data import mtrag_split
    from rl.adaptation.teacher import MODES, TEACHER, keep_record

    n = 2 if args.quick else args.n
    exs = mtrag_split(n)
    t0 = time.perf_counter()
    budget = args.budget_min * 60 if args.budget_min else None
    teacher, teacher_fp = answer(TEACHER, exs, 1 if args.quick else args.shards, budget)
    t_teacher = time.perf_counter() - t0
    done = {r.qid for r in teacher}
    exs = [e for e in exs if e.id in done]
    if not exs:
        raise SystemExit("the teacher answered no task (budget too small?)")
    student, student_fp = answer(STUDENT, exs, 1 if args.quick else args.shards, None)
    ds = f"mtrag/train[:{len(exs)}]/gold"
    rows = []
    for label, recs in ((TEACHER_LABEL, teacher), (STUDENT_LABEL, student)):
        rows += [metric_row(ds, label, "answer_f1", [r.f1 for r in recs]),
                 metric_row(ds, label, "citation_precision", [r.cite_precision for r in recs]),
                 metric_row(ds, label, "kept", [float(keep_record(r)) for r in recs])]
    rows.append(metric_row(ds, f"{TEACHER_LABEL} - {STUDENT_LABEL}", "delta_answer_f1",
                           [a.f1 - b.f1 for a, b in zip(teacher, student, strict=True)]))
    secs = {label: float(np.mean([r.seconds for r in recs]))
            for label, recs in ((TEACHER_LABEL, teacher), (STUDENT_LABEL, student))}
    spec = MODES[MODE]
    labels = {str(e.meta["answerability"]) for e in exs}
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    table = ["| system | metric | value | 95% CI | n |", "|---|---|---|---|---|"] + [
        f"| {r['system']} | {r['metric']} | {r['value']:+.3f} | [{fmt(r['ci_low'])}, "
        f"{fmt(r['ci_high'])}] | {r['n']} |" if r["metric"].startswith("delta") else
        f"| {r['system']} | {r['metric']} | {r['value']:.3f} | [{fmt(r['ci_low'])}, "
        f"{fmt(r['ci_high'])}] | {r['n']} |" for r in rows]
    kept = sum(keep_record(r) for r in teacher)
    body = [
        f"The first {len(exs)} answer-holding tasks (answerability {', '.join(sorted(labels))}) "
        "of the MTRAG train split (configs/splits/mtrag.json), in split order; each prompt = the "
        "last user turn + up to 2 gold passages and 1 gold passage of another conversation of "
        "the same collection, shuffled, each cut at a sentence end to 700 characters "
        f"(`rl.adaptation.sft_data.mtrag_split`); prompt `{spec.prompt_id}`, greedy, "
        f"{spec.max_new_tokens} new tokens, both models on llama.cpp (Q4_K_M GGUF resp. the "
        "packaged SmolLM2 GGUF), one thread per model instance on the shared 2-core machine. "
        "answer_f1 = token F1 against the reference answer (MTRAG's references are long-form, "
        "median 50 words, so a short answer's F1 is bounded by its recall); "
        "citation_precision = share of the cited passages that are gold (0 when nothing is "
        f"cited); kept = cites something, only gold passages, F1 >= {spec.min_f1} "
        "(`rl.adaptation.teacher.keep_record`, the threshold fixed before the first run). "
        "The delta row is a paired bootstrap over the same tasks.", "", *table, "",
        f"Kept teacher answers: {kept} of {len(exs)} (what `python -m rl.adaptation.teacher "
        f"--mode {MODE} --export-sets DIR` writes as the MTRAG distillation sets). Seconds per "
        "answer, as stored when it was generated (one llama.cpp thread, the other core busy "
        "with the other shard): " + ", ".join(f"{k} {v:.1f} s" for k, v in secs.items())
        + f"; the teacher's {len(teacher)} answers took {sum(r.seconds for r in teacher) / 60:.0f}"
        " thread-minutes.",
    ]
    meta = make_meta(0, {"mtrag": data_root() / "mtrag/mtragun-human/generation_tasks"},
                     {"quick": args.quick, "n_tasks": len(exs), "teacher": TEACHER,
                      "student": STUDENT, "fingerprints": {TEACHER: teacher_fp,
                                                           STUDENT: student_fp}, "mode": MODE,
                      "prompt_id": spec.prompt_id, "max_new_tokens": spec.max_new_tokens,
                      "min_f1": spec.min_f1, "seconds_per_answer": secs,
                      "wall_s_this_run": round(t_teacher, 1)})
    write_results("teacher_mtrag", rows, meta, "MTRAG teacher data: Qwen vs the student's base "
                  "model on MTRAG train tasks (issue 21)", "\n".join(body))


if __name__ == "__main__":
    main()
