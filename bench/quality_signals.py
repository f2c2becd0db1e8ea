"""Do the reference-free answer signals (rag.metrics.signals) catch a wrong answer?

Answers labelled right / wrong by gold on the test splits of HotpotQA and MTRAG:
  real         the extractive reader at k = 2, 5, 10 of the question's passages ranked by word
               overlap (HotpotQA: its 10 paragraphs; MTRAG: its gold passages + 2 of other tasks);
               right: HotpotQA F1 >= 0.5; MTRAG precision against the reference >= 0.6, not only
               pronouns/articles ("You" is wrong); MTRAG's reference answer (right)
  adversarial  wrong by construction from the same contexts, beside the gold answer (right):
               metadata (titles made session timestamps, the answer one), title (a title sharing
               no word with gold), off_type (a date/number for what/who, a name for when/how
               many), echo (the question restated), distractor (a name from a non-gold passage),
               truncated (gold's first quarter), abstain, swapped (the previous question's gold)
The combination (rules, then a balanced logistic regression) is fitted on the train splits only
(HotpotQA: first TRAIN_QUESTIONS = 200; MTRAG: all) into rag/bundled/answer_signals/combined.json.
Rows: auc_wrong_answer (relevancy | faithfulness | combined; 95% CI resampling questions),
below_gate (share of each adversarial kind under GATE), spearman_human (mtrag-human: against the
mean faithfulness/appropriateness/completeness rating of the reference's, GPT-4o's and
Llama-3.1-405B's responses; `annotator`: one annotator against the others' mean, the agreement
a signal can hope for). Targets fixed before the run: combined >= 0.85 on hotpotqa, mtrag,
adversarial; >= 0.95 on adversarial:metadata/title/off_type; spearman_human >= 0.65.
`--questions N` caps every split and the judged tasks at N; `--quick` (< 2 min) uses 40 and writes
*.quick.*, not the combiner. MiniLM vectors are kept in <ragpilot cache>/quality_signals/.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from bench.common import make_meta, write_results  # noqa: E402
from rag.corpus.loaders import HOTPOTQA_FILE, MTRAG_FILE, data_root, load_dataset  # noqa: E402
from rag.generation.answer_check import DATE, YEAR, answer_type, expected_type  # noqa: E402
from rag.generation.extractive import ExtractiveReader  # noqa: E402
from rag.generation.prompts import INSUFFICIENT  # noqa: E402
from rag.metrics.qa import best_em_f1  # noqa: E402
from rag.metrics.signals import FEATURES, GATE, AnswerSignals, Combiner, passes_rules  # noqa: E402
from rag.models import cache_dir  # noqa: E402
from rag.resources import bundled  # noqa: E402
from rag.types import Answer, Context  # noqa: E402

HUMAN = "mtrag/mtrag-human/evaluations/reference_subset_with_human_evaluations.json"
SPLITS = Path(__file__).resolve().parents[1] / "configs" / "splits"
SEED, TRAIN_QUESTIONS, BOOT = 0, 200, 500
KINDS = ("metadata", "title", "off_type", "echo", "distractor", "truncated", "abstain", "swapped")
TARGETS = {"hotpotqa": 0.85, "mtrag": 0.85, "adversarial": 0.85, "adversarial:metadata": 0.95,
           "adversarial:title": 0.95, "adversarial:off_type": 0.95, "mtrag-human": 0.65}
_CAP = re.compile(r"\b[A-Z][\w'\-]+(?:\s+[A-Z][\w'\-]+)*")
_NUM = re.compile(r"\b\d[\d,]*(?:\.\d+)?\b")
_WORD = re.compile(r"\w+")
_EMPTY = frozenset(re.findall(r"\S+", "a an the i you we they he she it me us them this that yes no"))


def log(msg: str) -> None:
    print(f"[quality_signals {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def _overlap_rank(q: str, contexts: list[Context]) -> list[Context]:
    return sorted(contexts, key=lambda c: -len(_words(q) & _words(f"{c.title} {c.text}")))


def timestamp(rng: random.Random) -> str:
    h, m = rng.randint(1, 12), rng.choice([0, 15, 30, 45])
    month = rng.choice(["January", "February", "March", "April", "May", "June", "July",
                        "August", "September", "October", "November", "December"])
    return f"{h}:{m:02d} {rng.choice(['am', 'pm'])} on {rng.randint(1, 28)} {month}, {rng.randint(2019, 2024)}"


def _item(qid, question, text, contexts, label, source, kind="", cites=()):
    a = Answer(qid, question, text, tuple(cites), tuple(contexts), (), {}, 0, 0, source)
    return {"qid": qid, "label": int(label), "source": source, "kind": kind, "answer": a}


def _cites_of(text: str, contexts: list[Context]) -> tuple[int, ...]:
    return tuple(i for i, c in enumerate(contexts, 1) if text.lower() in c.text.lower())[:2]


def adversarial(qid, question, gold, contexts, gold_ids, rng) -> list[dict]:
    """Gold (right) + one wrong answer of each KIND that can be made for this question."""
    out = [_item(qid, question, gold, contexts, 1, "gold", cites=_cites_of(gold, contexts))]
    exp, gw = expected_type(question), _words(gold)

    def far(t: str) -> bool:  # shares no word with the gold answer
        return bool(t.strip()) and not (_words(t) & gw)

    def add(kind: str, text: str, ctx=contexts, cites=None):
        out.append(_item(qid, question, text, ctx, 0, "adv", kind,
                         _cites_of(text, ctx) if cites is None else cites))

    if exp != "date":
        stamped = [Context(c.id, timestamp(rng), c.text) for c in contexts]
        add("metadata", stamped[j := rng.randrange(len(stamped))].title, stamped, (j + 1,))
    titles = [c.title for c in contexts if far(c.title)]
    if titles:
        add("title", t := rng.choice(titles), cites=_cites_of(t, contexts) or (1,))
    text = " ".join(c.text for c in contexts)
    vals = ([m.group(0) for p in (DATE, YEAR, _NUM) for m in p.finditer(text)]
            if exp in ("entity", "person", "place") else
            [m.group(0) for m in _CAP.finditer(text) if answer_type(m.group(0)) == "text"]
            if exp in ("date", "number") else [])
    if vals := [v for v in vals if far(v)]:
        add("off_type", rng.choice(vals))
    echo = re.sub(r"^(what|which|who|whom|whose|when|where|how( many| much)?|is|are|was|were|"
                  r"do|does|did)\s+", "", question.strip().rstrip("?"), flags=re.I)
    if far(echo) or len(gw) <= 3:
        add("echo", echo, cites=())
    others = [c for c in contexts if c.id not in gold_ids]
    if others:
        c = rng.choice(others)
        spans = [m.group(0) for m in _CAP.finditer(c.text)
                 if far(m.group(0)) and answer_type(m.group(0)) == answer_type(gold)]
        if spans:
            add("distractor", rng.choice(spans), cites=(contexts.index(c) + 1,))
    if len(words := gold.split()) >= 2 and gold.lower() not in ("yes", "no"):
        add("truncated", " ".join(words[:max(1, len(words) // 4)]))
    add("abstain", INSUFFICIENT, cites=())
    return out


def swapped(items: list[dict]) -> list[dict]:
    """Each question's contexts answered with the previous question's gold answer (wrong)."""
    golds = [it for it in items if it["source"] == "gold"]
    return [_item(g["qid"], g["answer"].question, prev["answer"].text, g["answer"].contexts, 0,
                  "adv", "swapped") for prev, g in zip(golds[-1:] + golds[:-1], golds, strict=True)
            if prev["answer"].text != g["answer"].text]


def _split_ids(ds: str, split: str, n: int | None) -> set[str]:
    return set(json.loads((SPLITS / f"{ds}.json").read_text())["splits"][split][:n])


def _real(reader, qid, question, ranked, right) -> list[dict]:
    gens = [reader.generate(question, ranked[:k], "cite_concise") for k in (2, 5, 10)]
    return [_item(qid, question, g.text, ranked[:k], right(g.text), f"reader-k{k}", cites=g.citations)
            for k, g in zip((2, 5, 10), gens, strict=True)]


def hotpot_items(split: str, n: int | None, rng: random.Random) -> list[dict]:
    want, reader, items = _split_ids("hotpotqa", split, n), ExtractiveReader(), []
    for line in (data_root() / HOTPOTQA_FILE).open():
        rec = json.loads(line)
        if rec["id"] not in want:
            continue
        gold_titles = set(rec["supporting_facts"]["title"])
        ctx = [Context(f"{rec['id']}:{i}", t, " ".join(s)) for i, (t, s) in enumerate(
            zip(rec["context"]["title"], rec["context"]["sentences"], strict=True))]
        ranked = _overlap_rank(rec["question"], ctx)
        items += _real(reader, rec["id"], rec["question"], ranked,
                       lambda t, g=rec["answer"]: best_em_f1(t, (g,))[1] >= 0.5)
        items += adversarial(rec["id"], rec["question"], rec["answer"], ranked[:5],
                             {c.id for c in ctx if c.title in gold_titles}, rng)
    return items + swapped(items)


def mtrag_items(split: str, n: int | None, rng: random.Random) -> list[dict]:
    ds, want, reader, items = load_dataset("mtrag"), _split_ids("mtrag", split, n), ExtractiveReader(), []
    pool = list(ds.corpus)
    for e in ds.examples:
        if e.id not in want or not e.answers or e.metadata.get("answerability") in (
                "UNANSWERABLE", "UNDERSPECIFIED"):
            continue
        gold = [ds.corpus[p] for p in e.gold_passage_ids]
        extra = [p for p in rng.sample(pool, 6) if p.id not in e.gold_passage_ids][:2]
        ranked = _overlap_rank(e.question, [Context(p.id, p.title, p.text) for p in gold + extra])
        items.append(_item(e.id, e.question, e.answers[0], ranked, 1, "reference"))
        items += _real(reader, e.id, e.question, ranked, lambda t, g=e.answers: (
            best_em_f1(t, g)[2] >= 0.6 and bool(_words(t) - _EMPTY)))
        items += adversarial(e.id, e.question, e.answers[0], ranked, set(e.gold_passage_ids), rng)
    return items + swapped(items)


def human_items(n_tasks: int | None) -> list[dict]:
    """Judged responses of the first `n_tasks` tasks: `human` = the annotators' mean rating (each
    the mean of their three), `one` = the first annotator's, `rest` = the others' mean."""
    d = json.loads((data_root() / HUMAN).read_text())
    docs, tasks = {x["document_id"]: x for x in d["documents"]}, {t["task_id"]: t for t in d["tasks"]}
    keep = set(list(dict.fromkeys(ev["task_id"] for ev in d["evaluations"]))[:n_tasks])
    out = []
    for ev in d["evaluations"]:
        t, by = tasks[ev["task_id"]], {}
        user = [m["text"] for m in t["input"] if m.get("speaker") == "user"]
        for key in ("faithfulness", "appropriateness", "completeness"):
            for who, x in (ev["annotations"].get(key) or {}).items():
                by.setdefault(who, []).append(float(x["value"]))
        if ev["task_id"] in keep and by and user:
            ctx = [Context(c["document_id"], docs[c["document_id"]].get("title", ""),
                           docs[c["document_id"]]["text"]) for c in t.get("contexts") or []
                   if c["document_id"] in docs]
            per = [float(np.mean(v)) for v in by.values()]
            out.append({**_item(ev["task_id"], user[-1], ev["model_response"], ctx, 1,
                                ev["model_id"]), "human": float(np.mean(per)), "one": per[0],
                        "rest": float(np.mean(per[1:])) if len(per) > 1 else np.nan})
    return out


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """P(score of a right answer > score of a wrong one), ties count half."""
    return float(roc_auc_score(labels, scores)) if 0 < labels.sum() < len(labels) else np.nan


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ok = np.isfinite(a) & np.isfinite(b)
    return float(spearmanr(a[ok], b[ok]).statistic)


def cluster_boot(fn, groups: np.ndarray, n: int) -> tuple[float, float]:
    """95% percentile CI of fn(index array) resampling whole questions."""
    rng = np.random.default_rng(SEED)
    uniq = np.unique(groups)
    where = {g: np.flatnonzero(groups == g) for g in uniq}
    vals = [fn(np.concatenate([where[g] for g in rng.choice(uniq, len(uniq))]))
            for _ in range(n)]
    vals = [v for v in vals if np.isfinite(v)] or [np.nan]
    return float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))


def row(dataset, system, metric, value, ci, n):
    return {"dataset": dataset, "system": system, "metric": metric, "value": float(value),
            "ci_low": ci[0], "ci_high": ci[1], "n": int(n)}


def score_items(sig: AnswerSignals, items: list[dict]) -> np.ndarray:
    """FEATURES per item + a last column: 1 for an abstention (scored 0, not trained on)."""
    return np.array([np.append(np.zeros(len(FEATURES)) if f is None else f, float(f is None))
                     for f in sig.features([it["answer"] for it in items])])


def train_combiner(X: np.ndarray, y: np.ndarray) -> Combiner:
    """A balanced logistic regression on the train answers that pass the rules."""
    keep = (X[:, -1] == 0) & np.array([passes_rules(f) for f in X[:, :-1]])
    X, y = X[keep, :-1], y[keep]
    mean, scale = X.mean(0), X.std(0)
    scale[scale < 1e-9] = 1.0
    lr = LogisticRegression(C=1.0, max_iter=2000, class_weight="balanced").fit((X - mean) / scale, y)
    return Combiner(lr.coef_[0], lr.intercept_[0], mean, scale, FEATURES,
                    {"trained_on": "hotpotqa train + mtrag train (bench/quality_signals.py)",
                     "n": int(len(y)), "positives": int(y.sum()), "seed": SEED})


def systems(comb: Combiner, x: np.ndarray) -> dict[str, np.ndarray]:
    ruled_out = np.array([f[-1] == 1 or not passes_rules(f[:-1]) for f in x], dtype=bool)
    return {"relevancy": x[:, FEATURES.index("relevancy")],
            "faithfulness": x[:, FEATURES.index("faithfulness")],
            "combined": np.where(ruled_out, 0.0, comb.predict(x[:, :-1]) if len(x) else 0.0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="40 questions per split; *.quick.*")
    ap.add_argument("--questions", type=int, default=None,
                    help="at most this many questions per split and judged tasks (default all)")
    args = ap.parse_args()
    n = 40 if args.quick else args.questions
    boot = 200 if args.quick else BOOT
    rng, t0, data = random.Random(SEED), time.perf_counter(), {}
    for ds, build in (("hotpotqa", hotpot_items), ("mtrag", mtrag_items)):
        for split in ("train", "test"):
            hp_train = (ds, split) == ("hotpotqa", "train")
            data[ds, split] = build(split, min(n or TRAIN_QUESTIONS, TRAIN_QUESTIONS) if hp_train else n, rng)
            log(f"{ds}/{split}: {len(data[ds, split])} answers")
    data["human", ""] = human_items(n)
    sig, X = AnswerSignals(combiner=None), {}
    vec_file, cache = cache_dir() / "quality_signals" / "vectors.npz", sig.embedder._cache
    if vec_file.is_file():
        z = np.load(vec_file)
        cache.update(zip(z["keys"].tolist(), z["vecs"], strict=True))
    vec_file.parent.mkdir(parents=True, exist_ok=True)
    for key, items in data.items():
        t1 = time.perf_counter()
        X[key] = score_items(sig, items)
        np.savez(vec_file, keys=np.array(list(cache)), vecs=np.stack(list(cache.values())))
        log(f"features {key}: {len(items)} answers in {time.perf_counter() - t1:.0f}s")

    train = [("hotpotqa", "train"), ("mtrag", "train")]
    comb = train_combiner(np.vstack([X[k] for k in train]),
                          np.array([it["label"] for k in train for it in data[k]]))
    if not args.quick:
        comb.to_json(bundled("answer_signals/combined.json"))
        log("wrote the bundled combiner")

    rows = []

    def auc_rows(dataset: str, items: list[dict], x: np.ndarray, keep=lambda it: True):
        sel = [i for i, it in enumerate(items) if keep(it)]
        y, groups = (np.array([items[i][k] for i in sel]) for k in ("label", "qid"))
        for name, s in systems(comb, x[sel]).items():
            ci = cluster_boot(lambda i, s=s: auc(s[i], y[i]), groups, boot)
            rows.append(row(dataset, name, "auc_wrong_answer", auc(s, y), ci, len(y)))

    for ds in ("hotpotqa", "mtrag"):
        auc_rows(ds, data[ds, "test"], X[ds, "test"])
        auc_rows(f"{ds}:real", data[ds, "test"], X[ds, "test"],
                 lambda it: it["source"] not in ("adv", "gold"))
    items = data["hotpotqa", "test"] + data["mtrag", "test"]
    x = np.vstack([X["hotpotqa", "test"], X["mtrag", "test"]])
    auc_rows("adversarial", items, x, lambda it: it["source"] in ("adv", "gold"))
    for kind in KINDS:
        auc_rows(f"adversarial:{kind}", items, x,
                 lambda it, k=kind: it["source"] == "gold" or it["kind"] == k)
    for kind in KINDS:  # after every AUC row, as the table reads
        sel = [i for i, it in enumerate(items) if it["kind"] == kind]
        rows.append(row(f"adversarial:{kind}", "combined", "below_gate", np.mean(
            systems(comb, x[sel])["combined"] < GATE), (None, None), len(sel)))
    humans = data["human", ""]
    h, groups = np.array([it["human"] for it in humans]), np.array([it["qid"] for it in humans])
    pairs = {name: (s, h) for name, s in systems(comb, X["human", ""]).items()}
    pairs["annotator"] = tuple(np.array([it[k] for it in humans]) for k in ("one", "rest"))
    for name, (s, t) in pairs.items():
        ci = cluster_boot(lambda i, s=s, t=t: spearman(s[i], t[i]), groups, boot)
        rows.append(row("mtrag-human", name, "spearman_human", spearman(s, t), ci,
                        int(np.isfinite(t).sum())))

    def fmt(r):
        ci = "" if r["ci_low"] is None else f" [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
        t = TARGETS.get(r["dataset"]) if r["system"] == "combined" and ci else None
        tm = "| | |" if t is None else f"| ≥ {t} | {r['value'] - t:+.3f} |"
        return f"| {r['dataset']} | {r['system']} | {r['metric']} | {r['value']:.3f}{ci} | " \
               f"{r['n']} {tm}"
    counts = "".join(f"- {ds}/{sp}: {len(v)} answers, {sum(it['label'] for it in v)} right\n"
                     for (ds, sp), v in data.items() if ds != "human")
    md = ("Reference-free signals against gold right/wrong labels (definitions: the docstring "
          f"of bench/quality_signals.py, docs/quality.md).\n\n{counts}- mtrag-human: "
          f"{len(humans)} judged responses of {len(set(groups))} tasks\n\n"
          "| dataset | system | metric | value [95% CI] | n | target | margin |\n"
          "|---|---|---|---|---|---|---|\n" + "\n".join(fmt(r) for r in rows) + "\n")
    files = {"hotpotqa": HOTPOTQA_FILE, "mtrag": MTRAG_FILE, "mtrag-human": HUMAN}
    meta = make_meta(SEED, {k: data_root() / f for k, f in files.items()}, {
        "quick": args.quick, "gate": GATE, "questions": n, "seconds": round(time.perf_counter() - t0, 1),
        "combiner": dict(zip(FEATURES, comb.coef.round(3).tolist(), strict=True))})
    write_results("quality_signals", rows, meta, "Quality signals that catch a wrong answer", md)


if __name__ == "__main__":
    main()
