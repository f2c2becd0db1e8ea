"""The ingest step of bench/gpu_models.py: what the device returned, scored here with the
project's own scorers.

    python bench/gpu_models_ingest.py --from OUT --notes-dir DIR   # OUT: what the device wrote

Writes
  bench/results/gpu_models.json + .md   every row of the GPU run (answer F1 and EM with 95% CIs,
                                        paired deltas, GPU seconds per answer, the judge's
                                        statistics, the teacher's yield);
  the teacher store                     `rl.adaptation.teacher.TeacherStore` records of the Qwen
                                        train answers, keyed by the GPU runtime's fingerprint;
  <notes-dir>/distill_teacher_<mode>.jsonl  the kept teacher answers as SFT examples
                                        (`filtered_examples`: F1 >= 0.5, every citation gold);
  <notes-dir>/dpo_pairs_<mode>.jsonl    judge-ranked preference pairs in the `rl.adaptation.prefs`
                                        layout: prompt (SmolLM2's chat template), chosen and
                                        rejected in the answer format (`<answer> [i][j]`);
  the embedding cache                   the nomic SciFact vectors, so `bench/models.py` scores
                                        dense-nomic / hybrid-nomic without re-encoding.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    make_meta,
    metric_row,
    optional_data,
    plain_row,
    write_results,
)
from bench.gpu_models import NOMIC, QWEN, _read_gz  # noqa: E402
from rag.metrics.qa import best_em_f1  # noqa: E402

HOTPOT_DS = "hotpotqa/test/hybrid-k5"


def _score(ans: dict, row: dict) -> tuple[float, float, float]:
    """(F1, EM, citation precision vs the gold positions; 0 when nothing is cited)."""
    em, f1, _, _ = best_em_f1(ans["text"], row["answers"])
    cited, gold = set(ans["citations"]), set(row["gold_positions"])
    return f1, em, (len(cited & gold) / len(cited) if cited else 0.0)


def _answers(answers, model, set_name, prompt, tag="greedy") -> dict[str, dict]:
    return {a["id"]: a for a in answers if a["model"] == model and a["set"] == set_name
            and a["prompt"] == prompt and a["tag"] == tag}


def _seconds(info: dict, key: str) -> float | None:
    s = info["stages"].get(key)
    return s["s_per_answer"] if s else None


def _generation_rows(jobs, answers, info, rows, notes) -> None:
    sets = jobs["sets"]
    chosen = info.get("qwen_prompt", {}).get("chosen", "cite_concise")
    for p in info.get("qwen_prompt", {}).get("valid_f1", {}):
        got = _answers(answers, "qwen", "valid-hybrid", p)
        vals = [_score(got[r["id"]], r)[0] for r in sets["valid-hybrid"] if r["id"] in got]
        rows.append(metric_row("hotpotqa/valid/hybrid-k5", f"qwen2.5-coder-1.5b:{p}",
                               "answer_f1", vals))
    test = sets["test-hybrid"]
    per: dict[str, np.ndarray] = {}
    for label, system, prompt in (("qwen", "qwen2.5-coder-1.5b", chosen),
                                  ("qwen", "qwen2.5-coder-1.5b:cite_concise", "cite_concise"),
                                  ("smollm2", "smollm2-135m", "cite_concise")):
        if system.endswith("cite_concise") and chosen == "cite_concise":
            continue  # the same answers as the first row
        got = _answers(answers, label, "test-hybrid", prompt)
        if len(got) != len(test):
            notes.append(f"{system}: {len(got)} of {len(test)} test answers came back; no rows")
            continue
        s = np.array([_score(got[r["id"]], r) for r in test])
        per[system] = s[:, 0]
        rows.append(metric_row(HOTPOT_DS, system, "answer_f1", s[:, 0]))
        rows.append(metric_row(HOTPOT_DS, system, "em", s[:, 1]))
        if prompt == "cite_concise":
            rows.append(metric_row(HOTPOT_DS, system, "cite_precision", s[:, 2]))
        sec = _seconds(info, f"{label}/test-hybrid/{prompt}/greedy")
        if sec is not None:
            rows.append(plain_row(HOTPOT_DS, system, "gpu_s_per_answer", sec, len(test)))
    if {"qwen2.5-coder-1.5b", "smollm2-135m"} <= set(per):
        rows.append(metric_row(HOTPOT_DS, "qwen2.5-coder-1.5b - smollm2-135m", "answer_f1_diff",
                               per["qwen2.5-coder-1.5b"] - per["smollm2-135m"]))
    for key in ("qwen/load", "smollm2/load"):
        if key in info["stages"]:
            rows.append(plain_row("hotpotqa", key.split("/")[0], "gpu_load_s",
                                  info["stages"][key]["seconds"], 1))
    kind = "zero-shot" if chosen == "cite_concise" else f"prompt `{chosen}` chosen on valid"
    notes.append(f"Qwen test rows: {kind} (valid F1 per prompt: "
                 f"{info.get('qwen_prompt', {}).get('valid_f1')}); greedy, 32 new tokens, "
                 f"transformers {info.get('transformers')} bf16 on {info.get('device')} "
                 f"(the Q4_K_M GGUF dequantised at load), batches of 48 sorted by length.")


def _judge_rows(judge, rows, notes) -> None:
    from rag.metrics.judge import JudgeResult
    from rag.metrics.pairwise_judge import judge_stats

    for with_ctx, system in ((False, "judge:qwen"), (True, "judge:qwen+passages")):
        pairs = [j for j in judge if j["set"] == "test-hybrid" and j["with_contexts"] == with_ctx]
        if not pairs:
            continue
        res = [JudgeResult(j["winner"], j["forward"], j["backward"], j["flipped"], j["margin"])
               for j in pairs]
        f1a = [best_em_f1(j["text_a"], j["answers"])[1] for j in pairs]
        f1b = [best_em_f1(j["text_b"], j["answers"])[1] for j in pairs]
        st = judge_stats(res, f1a, f1b)
        ds = "hotpotqa/test/answer-pairs (gpu logprob)"
        same = [float(r.forward != r.backward and "tie" not in (r.forward, r.backward))
                for r in res]
        rows.append(metric_row(ds, system, "position_bias", same))
        rows.append(metric_row(ds, system, "tie_rate", [float(r.winner == "tie") for r in res]))
        differ = [(r, a, b) for r, a, b in zip(res, f1a, f1b, strict=True) if abs(a - b) > 1e-9]
        agree = [float(r.winner == ("A" if a > b else "B")) for r, a, b in differ]
        rows.append(metric_row(ds, system, "agreement_with_f1_preference", agree))
        dec = [float(r.winner == ("A" if a > b else "B")) for r, a, b in differ
               if r.winner != "tie"]
        if dec:
            rows.append(metric_row(ds, system, "agreement_decisive", dec))
        # the order-averaged log-odds decides every pair (no tie): position-debiased
        lo = [float((r.margin > 0) == (a > b)) for r, a, b in differ if r.margin != 0]
        rows.append(metric_row(ds, system + ":logodds", "agreement_with_f1_preference", lo))
        notes.append(f"{system}: {len(res)} test answer pairs (Qwen / SmolLM2 / extractive "
                     f"reader, identical answers dropped), {int(st['n_f1_differ'])} with "
                     f"different gold F1; verdict per order = the likelier of the next tokens "
                     f"'A'/'B'; order-swapped, disagreement = tie. `:logodds` decides by the "
                     f"sign of the order-averaged log p(A) - log p(B) instead.")


def _pair_rows(judge, sets, notes_dir: Path, rows, notes, ranker: str = "judge:qwen") -> None:
    """dpo_pairs_<mode>.jsonl from the train verdicts (ties dropped; a pair with an empty side
    or two identical targets (answer and citations) is dropped and counted: a DPO trainer refuses it, `rl.adaptation.prefs`)."""
    from transformers import AutoTokenizer

    from rag.generation.local import ensure_converted
    from rag.types import Context
    from rl.adaptation.generator_model import render_prompt
    from rl.adaptation.sft_data import format_target

    tok = AutoTokenizer.from_pretrained(str(ensure_converted("smollm2-135m-instruct")))

    for mode in ("gold", "hybrid"):
        set_name = f"train-{mode}"
        by_id = {r["id"]: r for r in sets[set_name]}
        pairs = [j for j in judge if j["set"] == set_name]
        out, degenerate = [], 0
        for j in pairs:
            if j["winner"] == "tie":
                continue
            r = by_id[j["id"]]
            win, lose = (("a", "b") if j["winner"] == "A" else ("b", "a"))
            chosen = format_target(j[f"text_{win}"], j.get(f"cites_{win}", []))
            rejected = format_target(j[f"text_{lose}"], j.get(f"cites_{lose}", []))
            if not j[f"text_{win}"].strip() or not j[f"text_{lose}"].strip() or chosen == rejected:
                degenerate += 1
                continue
            ctxs = [Context(c["id"], c["title"], c["text"], c["score"]) for c in r["contexts"]]
            out.append({"prompt": render_prompt(tok, r["question"], ctxs, "cite_concise"),
                        "chosen": chosen, "rejected": rejected,
                        "id": r["id"], "source": f"hotpotqa-train-{mode}",
                        "chosen_score": abs(j["margin"]), "rejected_score": -abs(j["margin"]),
                        "ranker": ranker, "chosen_model": j[win],
                        "rejected_model": j[lose]})
        path = notes_dir / f"dpo_pairs_{mode}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in out))
        rows.append(plain_row(f"hotpotqa/train[:{len(sets[set_name])}]/{mode}", ranker,
                              "preference_pairs", len(out), len(pairs)))
        qwen_won = sum(x["chosen_model"] == "qwen" for x in out)
        notes.append(f"Preference pairs ({mode} contexts): {len(out)} decisive of {len(pairs)} "
                     f"judged (Qwen preferred in {qwen_won}; {degenerate} decisive pairs "
                     f"dropped for an empty answer on one side or two identical targets); {path}.")


def _teacher(jobs, answers, info, notes_dir: Path, rows, notes, store_path=None) -> None:
    from rag.types import Context
    from rl.adaptation.sft_data import SFTExample, format_target, save_examples
    from rl.adaptation.teacher import (
        TEACHER,
        TeacherRecord,
        TeacherStore,
        filtered_examples,
        score,
        teacher_key,
    )

    fp = info["stages"].get("qwen/load", {}).get("fingerprint")
    if not fp:
        notes.append("teacher: Qwen did not load on the device; no teacher records")
        return
    store = TeacherStore(store_path)
    for mode in ("gold", "hybrid"):
        set_name = f"train-{mode}"
        got = _answers(answers, "qwen", set_name, "cite_concise")
        sec = _seconds(info, f"qwen/{set_name}/cite_concise/greedy") or 0.0
        exs, recs = [], []
        for r in jobs["sets"][set_name]:
            ctxs = tuple(Context(c["id"], c["title"], c["text"], c["score"])
                         for c in r["contexts"])
            ex = SFTExample(r["id"], r["question"], ctxs,
                            format_target(r["answers"][0], r["gold_positions"]), "hotpotqa",
                            tuple(r["answers"]), tuple(r["gold_positions"]))
            exs.append(ex)
            a = got.get(r["id"])
            if a is None:
                continue
            f1, prec = score(a["text"], a["citations"], ex)
            rec = TeacherRecord(teacher_key(fp, "cite_concise", ex, 32), ex.id, mode, TEACHER,
                                a["raw"], a["text"], tuple(a["citations"]), f1, prec, sec,
                                "cite_concise", 32)
            store.put(rec)
            recs.append(rec)
        kept = filtered_examples(exs, recs)
        save_examples(kept, notes_dir / f"distill_teacher_{mode}.jsonl")
        ds = f"hotpotqa/train[:{len(exs)}]/{mode}"
        rows.append(metric_row(ds, "teacher:qwen", "answer_f1", [r.f1 for r in recs]))
        rows.append(metric_row(ds, "teacher:qwen", "cite_precision",
                               [r.cite_precision for r in recs]))
        rows.append(plain_row(ds, "teacher:qwen", "kept", len(kept), len(recs)))
        if sec:
            rows.append(plain_row(ds, "teacher:qwen", "gpu_s_per_answer", sec, len(recs)))
        notes.append(f"Teacher ({mode} contexts): {len(recs)} answers, {len(kept)} kept "
                     f"(F1 >= 0.5 and every citation gold) -> "
                     f"{notes_dir / f'distill_teacher_{mode}.jsonl'}; store {store.path}.")


def _nomic(src: Path, info, rows, notes) -> None:
    from rag.models import cache_dir

    st = info["stages"].get("nomic/scifact")
    if not st:
        notes.append("nomic: no vectors were made " + str(info["stages"].get("nomic/check", "")))
        return
    rows.append(plain_row("scifact/test", "dense-nomic", "gpu_index_build_s", st["seconds"],
                          st["docs"]))
    if st.get("min_cosine_vs_cpu") is not None:
        rows.append(plain_row("scifact/test", "dense-nomic", "min_cosine_gpu_vs_cpu",
                              st["min_cosine_vs_cpu"], 16))
    f, dest = src / "nomic_scifact.npy", cache_dir() / "embeddings" / st["file"]
    if f.exists():  # 16 MB: it comes back from the device but is not committed
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest)
    where = (f"copied to {dest} for `python bench/models.py --only encoders` to score"
             if f.exists() else f"not in {src} (the device's copy went to the embedding cache "
                                f"as {st['file']})")
    notes.append(f"nomic: {st['docs']} SciFact documents embedded on the GPU in "
                 f"{st['seconds']:.1f} s (fp32 port), min cosine vs the CPU port on 16 texts "
                 f"{st.get('min_cosine_vs_cpu')}; vectors {where}.")


def annotate_judge(jobs: dict, answers: list[dict], judge: list[dict]) -> list[dict]:
    """`judge` (the device run's verdicts) with the gold answers (`answers`) and each side's
    citations (`cites_a` / `cites_b`, where the answer log has them) set beside each verdict,
    in place; what `_judge_rows` and `_pair_rows` read."""
    gold = {(s, r["id"]): r["answers"] for s, rs in jobs["sets"].items() for r in rs}
    cites = {(a["model"], a["set"], a["id"], a["tag"]): a["citations"] for a in answers
             if a["prompt"] == "cite_concise"}
    for j in judge:
        j["answers"] = gold[(j["set"], j["id"])]
        for side in ("a", "b"):
            model, _, tag = j[side].partition(":")
            c = cites.get((model, j["set"], j["id"], tag or "greedy"))
            if c is not None:
                j[f"cites_{side}"] = c
    return judge


def ingest(cargo: Path, src: Path, notes_dir: Path, store_path: Path | None = None) -> None:
    jobs = _read_gz(cargo / "jobs.json.gz")
    info = json.loads((src / "run.json").read_text())
    answers = _read_gz(src / "answers.json.gz")
    judge = annotate_judge(jobs, answers, _read_gz(src / "judge.json.gz"))
    rows: list[dict] = []
    notes: list[str] = []
    _generation_rows(jobs, answers, info, rows, notes)
    _judge_rows(judge, rows, notes)
    _pair_rows(judge, jobs["sets"], notes_dir, rows, notes)
    _teacher(jobs, answers, info, notes_dir, rows, notes, store_path)
    _nomic(src, info, rows, notes)
    meta = make_meta(0, optional_data({"hotpotqa": "hotpotqa", "scifact": "scifact"}),
                     {"device_run": {k: v for k, v in info.items() if k != "stages"},
                      "stages": info["stages"], "models": [QWEN, "smollm2-135m-instruct", NOMIC],
                      "notes": notes})
    body = ["Device run: " + ", ".join(f"{k} {info.get(k)}" for k in
                                       ("device", "torch", "transformers", "peak_gpu_mb")),
            "", "| dataset | system | metric | value | 95% CI | n |", "|---|---|---|---|---|---|"]
    for r in rows:
        ci = "" if r["ci_low"] is None else f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
        body.append(f"| {r['dataset']} | {r['system']} | {r['metric']} | {r['value']:.4g} | "
                    f"{ci} | {r['n']} |")
    body += ["", "Seconds per stage on the device (wall, model load included where named):", ""]
    body += [f"- {k}: {v['seconds']} s" + (f" ({v['n']} items)" if "n" in v else "")
             for k, v in info["stages"].items()]
    body += ["", *[f"- {n}" for n in notes]]
    if info.get("errors"):
        body += ["", "Errors on the device:", *[f"- {e}" for e in info["errors"]]]
    write_results("gpu_models", rows, meta, "Packaged models on a lent GPU", "\n".join(body))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cargo", type=Path, default=Path(".gpu_cargo"))
    ap.add_argument("--from", dest="src", type=Path, required=True)
    ap.add_argument("--notes-dir", type=Path, required=True,
                    help="where the distillation and preference sets are written")
    ap.add_argument("--store", type=Path, help="teacher store (default: the cache's)")
    a = ap.parse_args()
    ingest(a.cargo, a.src, a.notes_dir, a.store)


if __name__ == "__main__":
    main()
