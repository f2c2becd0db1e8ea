"""Issue 21, item 3: DPO, IPO and ORPO of SmolLM2 on the Qwen judge's preference pairs, each
against the gold-SFT baseline, end to end on HotpotQA test (the protocol of
bench/generator_adaptation.py: first 100 test questions, default `RAGConfig()` top 5,
`cite_concise`, greedy, 20 new tokens, fp32 on CPU; paired bootstrap of the per-question F1).

    python bench/generator_prefs.py --section pairs --out DIR   # 1. the judge-ranked pairs
    ragpilot train-generator {dpo,ipo,orpo} ...                 # 2. one run per method
    python bench/generator_adaptation.py --section eval --eval-n 100 --system LABEL=REF ...
                                                                # 3. answers (parallel-safe)
    python bench/generator_prefs.py                             # 4. json + md from the part
    python bench/generator_prefs.py --quick                     # the 4-question part

pairs: `dpo_pairs_gold.jsonl` / `dpo_pairs_hybrid.jsonl` from the committed device run
  (`bench/results/gpu_models_raw`: the Qwen judge's order-swapped verdicts on (Qwen, SmolLM2)
  answers to the 500 HotpotQA train questions; ties dropped), the same 1,217 pairs as
  `bench/gpu_models_ingest.py` writes (`bench.gpu_models_ingest._pair_rows`).
pairs --ranker judge:qwen+reference:pointwise: the same answer pairs re-judged against the gold
  answer (2,763 decisive pairs; the grades resume from DIR/grades.json), trained as
  `smollm2-<method>-ref`.
render: every method system (`smollm2-dpo`, `smollm2-ipo`, `smollm2-orpo`, each `-ref`) found
  in the eval part beside `smollm2-sft`, with the training line from each merged folder's
  metadata; a method not re-run here is named as such (the committed `smollm2-dpo` row of
  bench/results/generator_adaptation.json came from the same SFT recipe and pairs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag.env import configure_runtime_env  # noqa: E402

configure_runtime_env()

import bench.generator_adaptation as ga  # noqa: E402
from bench.common import make_meta, metric_row, plain_row, write_results  # noqa: E402
from bench.judge_reference import POINTWISE, QWEN, RAW  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402

NAME = "generator_prefs"
METHOD_SYSTEMS = ("smollm2-dpo", "smollm2-ipo", "smollm2-orpo")
REF_SYSTEMS = tuple(f"{s}-ref" for s in METHOD_SYSTEMS)
"""The same methods on the pairs re-judged against the gold answer (`--ranker POINTWISE`)."""


def write_pairs(out: Path, raw: Path = RAW, ranker: str = "judge:qwen",
               device: str = "cpu") -> tuple[list[dict], list[str]]:
    """The judge-ranked pairs of the committed device run into `out` (one JSONL per context
    mode); returns the rows (`relabel_pointwise`'s, then `preference_pairs`) and the notes
    (pair counts per context mode). `ranker` `judge:qwen`: the device run's own
    verdicts; `POINTWISE`: the same (Qwen, SmolLM2) train pairs re-judged here by the
    reference-guided pointwise judge (`relabel_pointwise`)."""
    from bench.gpu_models import _read_gz
    from bench.gpu_models_ingest import _pair_rows, annotate_judge

    jobs, answers, judge = (_read_gz(raw / f) for f in
                            ("jobs.json.gz", "answers.json.gz", "judge.json.gz"))
    annotate_judge(jobs, answers, judge)
    rows: list[dict] = []
    if ranker == POINTWISE:
        judge, rows = relabel_pointwise(judge, jobs, out, device)
    elif ranker != "judge:qwen":
        raise SystemExit(f"--ranker {ranker!r}: judge:qwen or {POINTWISE}")
    notes: list[str] = []
    _pair_rows(judge, jobs["sets"], out, rows, notes, ranker=ranker)
    print("\n".join(notes))
    return rows, notes


GRADE_CHUNK = 32


def relabel_pointwise(judge: list[dict], jobs: dict, out: Path, device: str
                      ) -> tuple[list[dict], list[dict]]:
    """(verdicts, rows): the train verdicts of `judge` (annotated: gold answers beside each)
    re-decided by the reference-guided pointwise judge: each distinct (question, answer)
    graded once against the gold answer (`rag.metrics.pairwise_judge.PointwiseJudgeBackend`),
    the higher grade wins, equal grades tie. Grades are kept in `out/grades.json` after every
    chunk (a cut run resumes); `out/relabel.json` says how the new verdicts compare with the device run's and
    with the gold-F1 preference (the rows)."""
    import numpy as np

    from rag.generation.local import TransformersGenerator
    from rag.metrics.pairwise_judge import PointwiseJudgeBackend, reference_text
    from rag.metrics.qa import best_em_f1
    from rag.models import default_registry

    question = {r["id"]: r["question"] for rs in jobs["sets"].values() for r in rs}
    train = [j for j in judge if j["set"].startswith("train-")]
    keys = list(dict.fromkeys((j["id"], t) for j in train for t in (j["text_a"], j["text_b"])))
    gold = {j["id"]: reference_text(j["answers"]) for j in train}
    path = out / "grades.json"
    grades = json.loads(path.read_text()) if path.exists() else {}
    todo = [k for k in keys if json.dumps(k) not in grades]
    if todo:
        gen = TransformersGenerator(default_registry().get(QWEN), device=device, cache=False)
        backend = PointwiseJudgeBackend(gen.choice_logprobs, gen.fingerprint, name=POINTWISE)
        out.mkdir(parents=True, exist_ok=True)
        for k in range(0, len(todo), GRADE_CHUNK):
            chunk = todo[k:k + GRADE_CHUNK]
            got = backend.grade([(question[i], t, gold[i]) for i, t in chunk])
            grades.update({json.dumps(key): g for key, g in zip(chunk, got, strict=True)})
            path.write_text(json.dumps(grades))
            print(f"[grades] {len(keys) - len(todo) + k + len(chunk)}/{len(keys)}", flush=True)
    new, same, agree_new, agree_old = [], [], [], []
    for j in judge:
        if not j["set"].startswith("train-"):
            new.append(j)
            continue
        ga, gb = (grades[json.dumps([j["id"], t])] for t in (j["text_a"], j["text_b"]))
        w = "A" if ga > gb else "B" if gb > ga else "tie"
        same.append(float(w == j["winner"]))
        fa, fb = (best_em_f1(t, j["answers"])[1] for t in (j["text_a"], j["text_b"]))
        if abs(fa - fb) > 1e-9:
            agree_new.append(float(w == ("A" if fa > fb else "B")))
            agree_old.append(float(j["winner"] == ("A" if fa > fb else "B")))
        new.append({**j, "winner": w, "forward": w, "backward": w, "flipped": False,
                    "margin": float(ga - gb)})
    ds = f"hotpotqa/train/answer-pairs[:{len(train)}]"
    rows = [
        metric_row(ds, POINTWISE, "agreement_with_f1_preference", agree_new),
        metric_row(ds, "judge:qwen", "agreement_with_f1_preference", agree_old),
        metric_row(ds, POINTWISE, "same_winner_as_judge_qwen", same),
        metric_row(ds, POINTWISE, "tie_rate", [float(x["winner"] == "tie") for x in new
                                               if x["set"].startswith("train-")]),
        plain_row(ds, POINTWISE, "graded_answers", len(keys), len(keys)),
        plain_row(ds, POINTWISE, "mean_grade", float(np.mean(list(grades.values()))),
                  len(grades))]
    (out / "relabel.json").write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows, indent=1))
    return new, rows


def method_part(part: dict) -> dict:
    """The eval part restricted to the baseline and the preference methods, baseline first."""
    keep = [ga.BASELINE, *(s for s in METHOD_SYSTEMS + REF_SYSTEMS if s in part["systems"])]
    if ga.BASELINE not in part["systems"]:
        raise SystemExit(f"the eval part has no {ga.BASELINE}: evaluate it first")
    return {**part, "systems": {k: part["systems"][k] for k in keep}}


def render(quick: bool, eval_n: int, commands: str | None, note: str | None = None) -> None:
    f = ga.PARTS / f"eval-test-{4 if quick else eval_n}.json"
    if not f.exists():
        raise SystemExit(f"{f} does not exist: run step 3 (module docstring) first")
    part = method_part(json.loads(f.read_text()))
    rows, md = ga.eval_rows(part)
    missing = [s for s in METHOD_SYSTEMS if s not in part["systems"]]
    body = [
        "Preference alignment of `smollm2-sft` on the Qwen judge's pairs, each method one run "
        "with the same steps and learning rate: `smollm2-<method>` on the device run's "
        "reference-free verdicts (`judge:qwen`), `smollm2-<method>-ref` on the same answer "
        f"pairs re-judged against the gold answer (`{POINTWISE}`); the training line names the "
        f"pairs each saw. The same first {part['n']} HotpotQA "
        "test questions for every system (`bench/generator_adaptation.py` eval protocol: hybrid "
        "k=5 contexts, `cite_concise`, greedy, 20 new tokens, fp32, one torch thread). No "
        "target was set for these rows (issue 21 asks for them with their CIs).", "",
        *md, "", "How each system was trained (its merged folder's `ragpilot_meta.json`):", "",
        *[ga._train_line(label, r.get("train") or {}) for label, r in part["systems"].items()],
        ""]
    if note:
        body += [note, ""]
    if missing:
        body += [f"Not re-run here: {', '.join(f'`{m}`' for m in missing)} (the committed "
                 "`smollm2-dpo` row is in bench/results/generator_adaptation.md, from the same "
                 "SFT recipe and pairs).", ""]
    if commands:
        body += [f"Commands: {commands}", ""]
    meta = make_meta(0, {"hotpotqa": data_root() / "hotpotqa"},
                     {"quick": quick, "part": str(f), "systems": list(part["systems"]),
                      "commands": commands, "note": note})
    write_results(NAME, rows, meta, "DPO, IPO and ORPO on the Qwen judge's pairs (issue 21)",
                  "\n".join(body))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--section", choices=["pairs", "render"], default="render")
    ap.add_argument("--out", type=Path, help="pairs: the folder for dpo_pairs_<mode>.jsonl")
    ap.add_argument("--ranker", default="judge:qwen",
                    help=f"pairs: judge:qwen (the device run's verdicts) or {POINTWISE} "
                         "(re-judged here against the gold answer)")
    ap.add_argument("--device", default="cpu", help="pairs: where the re-judging judge runs")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--eval-n", type=int, default=100)
    ap.add_argument("--commands", help="render: the commands of steps 1-3, for the md")
    ap.add_argument("--note", help="render: what the numbers say, for the md")
    a = ap.parse_args()
    if a.section == "pairs":
        if a.out is None:
            raise SystemExit("--section pairs needs --out DIR")
        write_pairs(a.out, ranker=a.ranker, device=a.device)
    else:
        render(a.quick, a.eval_n, a.commands, a.note)


if __name__ == "__main__":
    main()
