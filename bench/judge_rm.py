"""Issue 21, item 3: the Bradley–Terry reward model re-distilled from the Qwen judge's
preferences, against the committed `quality-rm` (distilled from the metric judge).

    python bench/judge_rm.py           # seconds: lexical features, a Newton fit
    python bench/judge_rm.py --quick   # the same on 200 train pairs (writes *.quick.*)

Teacher: `judge:qwen+reference:pointwise` (each answer graded alone against the gold answer,
bench/judge_reference.py), on the committed device run's (Qwen2.5-Coder-1.5B, SmolLM2-135M)
answer pairs to the 500 HotpotQA train questions, gold and hybrid contexts
(bench/results/gpu_models_raw; the grades `bench/generator_prefs.py --section pairs --ranker
judge:qwen+reference:pointwise` writes, committed in bench/results/judge_grades.json.gz). The student sees what a reward model sees at serving time:
the question, the contexts and the answer, never the gold answer (`rag.metrics.reward_model`
features). One fifth of the train questions (by a hash of the id) is held out.

Rows: agreement with the teacher on the held-out questions' pairs; agreement with the gold-F1
preference there and on the 816 HotpotQA test answer pairs of bench/judge_reference.py (pairs
whose F1 differs; a score tie counts half); each against `quality-rm` on the same pairs, as a
paired difference with a bootstrap CI. The model is saved (versioned) under
src/rag/bundled/reward_models/judge-rm/ unless --quick.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag.env import configure_runtime_env  # noqa: E402

configure_runtime_env()

import numpy as np  # noqa: E402

from bench.common import RESULTS, make_meta, metric_row, plain_row, write_results  # noqa: E402
from bench.judge_reference import POINTWISE as TEACHER  # noqa: E402
from bench.judge_reference import RAW, load_pairs  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402

NAME = "judge_rm"
STUDENT = "judge-rm"
BASELINE = "quality-rm"
GRADES = RESULTS / "judge_grades.json.gz"
HELD_OUT = 5
"""One question in HELD_OUT is held out (sha256 of its id)."""


def held_out(qid: str) -> bool:
    return int(hashlib.sha256(qid.encode()).hexdigest(), 16) % HELD_OUT == 0


def load(raw: Path = RAW, grades: Path = GRADES) -> tuple[list[dict], list[dict]]:
    """(train pairs, test pairs): each {id, question, contexts, answers, text_a, text_b, f1_a,
    f1_b, teacher} with teacher "A" / "B" / "tie" (train: the pointwise grades; test:
    bench/judge_reference.py's pairs (`load_pairs`) with its pointwise verdicts, in order)."""
    from bench.gpu_models import _read_gz
    from rag.metrics.qa import best_em_f1
    from rag.types import Context

    jobs, judge = _read_gz(raw / "jobs.json.gz"), _read_gz(raw / "judge.json.gz")
    g = json.loads(gzip.decompress(grades.read_bytes()))
    train_grades, test_verdicts = g["train_grades"], g["test_pointwise"]
    rows = {s: {r["id"]: r for r in rs} for s, rs in jobs["sets"].items()}

    def contexts(set_name: str, qid: str) -> list[Context]:
        return [Context(c["id"], c.get("title") or "", c["text"])
                for c in rows[set_name][qid]["contexts"]]

    train = []
    for j in judge:
        if j["set"].startswith("train-"):
            r = rows[j["set"]][j["id"]]
            ga, gb = (train_grades[json.dumps([j["id"], t])] for t in (j["text_a"], j["text_b"]))
            train.append({"id": j["id"], "question": r["question"],
                          "contexts": contexts(j["set"], j["id"]),
                          "text_a": j["text_a"], "text_b": j["text_b"],
                          "f1_a": best_em_f1(j["text_a"], r["answers"])[1],
                          "f1_b": best_em_f1(j["text_b"], r["answers"])[1],
                          "teacher": "A" if ga > gb else "B" if gb > ga else "tie"})
    test = load_pairs(raw)
    if len(test_verdicts) != len(test):
        raise SystemExit(f"{grades}: {len(test_verdicts)} test verdicts for {len(test)} pairs")
    test = [{**p, "contexts": contexts(p["set"], p["id"]), "teacher": v["winner"]}
            for p, v in zip(test, test_verdicts, strict=True)]
    return train, test


def features(pairs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    from rag.metrics.reward_model import answer_features

    fa = np.stack([answer_features(p["question"], p["contexts"], p["text_a"]) for p in pairs])
    fb = np.stack([answer_features(p["question"], p["contexts"], p["text_b"]) for p in pairs])
    return fa, fb


def agreements(rm, fa: np.ndarray, fb: np.ndarray, pairs: list[dict]) -> dict[str, list[float]]:
    """Per pair: 1 when the model prefers the side named, 0 when the other, 0.5 on a score tie;
    `teacher` over the pairs the teacher decided, `f1` over the pairs whose gold F1 differs."""
    d = rm.score_features(fa) - rm.score_features(fb)
    out: dict[str, list[float]] = {"teacher": [], "f1": []}
    for x, p in zip(d, pairs, strict=True):
        if p["teacher"] != "tie":
            out["teacher"].append(_hit(x, p["teacher"] == "A"))
        if abs(p["f1_a"] - p["f1_b"]) > 1e-9:
            out["f1"].append(_hit(x, p["f1_a"] > p["f1_b"]))
    return out


def _hit(diff: float, a_wins: bool) -> float:
    """Score difference a - b against the side that won: 1 agrees, 0 disagrees, 0.5 a tie."""
    return 0.5 if diff == 0 else float((diff > 0) == a_wins)


def fit(train: list[dict], fa: np.ndarray, fb: np.ndarray, l2: float):
    from rag.metrics.reward_model import RewardModel

    win = np.array([p["teacher"] == "A" for p in train])
    keep = np.array([p["teacher"] != "tie" for p in train])
    xw = np.where(win[:, None], fa, fb)[keep]
    xl = np.where(win[:, None], fb, fa)[keep]
    return RewardModel.fit(xw, xl, l2=l2, manifest={
        "teacher": f"{TEACHER}: log p(Yes) - log p(No) of 'does the answer give the same "
                   "answer as the reference?' (rag.metrics.pairwise_judge.PointwiseJudgeBackend)",
        "l2": l2, "training_data": {
            "pairs": int(keep.sum()), "questions": len({p["id"] for p in train}),
            "source": "bench/results/gpu_models_raw train-gold + train-hybrid pairs, "
                      "grades bench/results/judge_grades.json.gz",
            "held_out": f"sha256(id) % {HELD_OUT} == 0"}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--l2", type=float, default=1.0)
    a = ap.parse_args()
    from rag.metrics.reward_model import BUNDLED_ROOT, FEATURES, load_reward_model

    train, test = load()
    fit_pairs = [p for p in train if not held_out(p["id"])]
    valid = [p for p in train if held_out(p["id"])]
    if a.quick:
        fit_pairs, valid, test = fit_pairs[:200], valid[:100], test[:100]
    fa, fb = features(fit_pairs)
    rm = fit(fit_pairs, fa, fb, a.l2)
    base = load_reward_model(BASELINE)
    rows: list[dict] = []
    lines = []
    n_q = len({p["id"] for p in valid})
    for label, pairs in ((f"hotpotqa/train-heldout/answer-pairs[{n_q}q]", valid),
                         ("hotpotqa/test/answer-pairs", test)):
        xa, xb = features(pairs)
        ours, theirs = agreements(rm, xa, xb, pairs), agreements(base, xa, xb, pairs)
        for metric, key in (("agreement_with_judge", "teacher"),
                            ("agreement_with_f1_preference", "f1")):
            rows.append(metric_row(label, STUDENT, metric, ours[key]))
            rows.append(metric_row(label, BASELINE, metric, theirs[key]))
            rows.append(metric_row(label, f"{STUDENT} - {BASELINE}", f"delta_{metric}",
                                   np.subtract(ours[key], theirs[key])))
    train_agree = agreements(rm, fa, fb, fit_pairs)["teacher"]
    rows.append(metric_row("hotpotqa/train-fit/answer-pairs", STUDENT, "agreement_with_judge",
                           train_agree))
    rows.append(plain_row("hotpotqa/train-fit/answer-pairs", STUDENT, "pairs",
                          float(len(fit_pairs)), len(fit_pairs)))
    if not a.quick:
        saved = rm.save(BUNDLED_ROOT, STUDENT)
        lines.append(f"Saved: `{saved.relative_to(Path(__file__).resolve().parents[1])}` "
                     f"(`load_reward_model('{STUDENT}')`).")
    w = sorted(zip(FEATURES, rm.weights, strict=True), key=lambda t: -abs(t[1]))
    lines.append("Weights (standardised features, largest first): " + ", ".join(
        f"`{f}` {x:+.2f}" for f, x in w))
    wb = dict(zip(FEATURES, base.weights, strict=True))
    lines.append(f"`{BASELINE}` (v{base.manifest.get('version')}) on the same features: " + ", ".join(
        f"`{f}` {wb[f]:+.2f}" for f, _ in w))
    from bench.generator_adaptation import _rows_table

    body = [__doc__.split("\n\n")[2].replace("\n", " "), "", *_rows_table(rows, dataset=True),
            "", *[f"- {x}" for x in lines], "",
            f"Command: `python bench/judge_rm.py{' --quick' if a.quick else ''}`", ""]
    meta = make_meta(0, {"hotpotqa": data_root() / "hotpotqa"},
                     {"quick": a.quick, "teacher": TEACHER, "l2": a.l2,
                      "raw": str(RAW.relative_to(RESULTS.parent.parent)),
                      "grades_sha256": hashlib.sha256(GRADES.read_bytes()).hexdigest()})
    write_results(NAME, rows, meta, "A reward model distilled from the Qwen judge (issue 21)",
                  "\n".join(body))


if __name__ == "__main__":
    main()
