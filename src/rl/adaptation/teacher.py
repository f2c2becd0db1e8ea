"""Teacher data for distillation: a strong generator (Qwen2.5-Coder-1.5B on llama.cpp) answers
HotpotQA *train* questions with citations, over gold paragraphs or over the project's hybrid
retrieved contexts, and MTRAG *train* tasks over their gold passages; answers are scored against
gold and filtered.

Contract:
  input    `SFTExample`s (question, numbered contexts, gold answers, gold passage positions),
           from `teacher_examples(mode, n)`: mode "gold" (gold paragraphs + distractors, the
           SFT layout) or "hybrid" (the default `RAGConfig()` top-5 over the pooled corpus; gold
           positions = where the gold paragraphs landed, possibly none); mode "mtrag-gold"
           (`sft_data.mtrag_split`: the answer-holding MTRAG train tasks, last user turn, up to
           2 gold passages + 1 of another conversation, cut to 700 characters).
  prompt   per mode (`MODES`): HotpotQA `cite_concise`, 32 new tokens (a short answer);
           MTRAG `cite_long`, 96 new tokens (its references are long-form answers).
  store    `TeacherStore` (SQLite, WAL, safe across processes and Ray workers) keyed by
           sha256(model fingerprint, prompt id, question, contexts hash, max_new_tokens): a
           re-run answers only what is missing (resumable; a killed job loses one answer).
  record   `TeacherRecord`: raw reply, parsed answer, citations (1-based), answer F1 vs gold,
           citation precision vs gold positions, seconds it took to generate (read back unchanged from the store).
  filter   `keep_record`: F1 >= min_f1 and citation precision >= min_cite_precision (a
           citation of a non-gold passage teaches the student to cite wrongly). min_f1 is the
           mode's: 0.5 for HotpotQA's short answers; 0.3 for MTRAG, whose references (median 50
           words) bound the token F1 of a one-sentence answer by its recall (fixed before the
           first MTRAG run).

Runs as a Ray job: `ray job submit -- python -m rl.adaptation.teacher --mode gold --n 500`;
`--shards K` fans the questions out as K Ray tasks (one llama thread each) writing the same
store. Without Ray it runs in-process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rag.generation.base import Generator
from rag.metrics.qa import best_em_f1
from rag.models import cache_dir
from rl.adaptation.sft_data import SFTExample, format_target

TEACHER = "qwen2.5-coder-1.5b-instruct"


@dataclass(frozen=True)
class ModeSpec:
    """How the teacher answers one kind of example, and which answers are kept."""

    prompt_id: str = "cite_concise"
    max_new_tokens: int = 32
    min_f1: float = 0.5
    dataset: str = "hotpotqa"


MODES: dict[str, ModeSpec] = {
    "gold": ModeSpec(),
    "hybrid": ModeSpec(),
    "mtrag-gold": ModeSpec("cite_long", 96, 0.3, "mtrag"),
}
GOLD_MODES = {"hotpotqa": "gold", "mtrag": "mtrag-gold"}
"""Per dataset, the mode whose examples are the gold-target SFT recipe's (the gold half of
`export_sets`' teacher+gold set)."""


def mode_spec(mode: str) -> ModeSpec:
    try:
        return MODES[mode]
    except KeyError:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}") from None


@dataclass(frozen=True)
class TeacherRecord:
    key: str
    qid: str
    mode: str
    model: str
    raw: str
    text: str
    citations: tuple[int, ...]
    f1: float
    cite_precision: float
    seconds: float
    prompt_id: str | None = None
    max_new_tokens: int | None = None
    """How it was asked (None in records written before these fields existed: read as the
    mode's, `MODES`)."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "citations": list(self.citations)}


def contexts_hash(ex: SFTExample) -> str:
    h = hashlib.sha256()
    for c in ex.contexts:
        h.update(f"{c.id}\x00{c.title}\x00{c.text}\x01".encode())
    return h.hexdigest()


def teacher_key(fingerprint: str, prompt_id: str, ex: SFTExample, max_new_tokens: int) -> str:
    blob = json.dumps([fingerprint, prompt_id, ex.question, contexts_hash(ex), max_new_tokens])
    return hashlib.sha256(blob.encode()).hexdigest()


class TeacherStore:
    """key -> TeacherRecord in SQLite (default `<ragpilot cache>/teacher.sqlite`)."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else cache_dir() / "teacher.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._conn() as c:
            c.execute("CREATE TABLE IF NOT EXISTS teacher (key TEXT PRIMARY KEY, qid TEXT, "
                      "mode TEXT, model TEXT, value TEXT)")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=60)
            conn.execute("PRAGMA journal_mode=WAL")
            self._local.conn = conn
        return conn

    def get(self, key: str) -> TeacherRecord | None:
        row = self._conn().execute("SELECT value FROM teacher WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        d = json.loads(row[0])
        return TeacherRecord(**{**d, "citations": tuple(d["citations"])})

    def put(self, rec: TeacherRecord) -> None:
        with self._conn() as c:
            c.execute("INSERT OR REPLACE INTO teacher VALUES (?, ?, ?, ?, ?)",
                      (rec.key, rec.qid, rec.mode, rec.model, json.dumps(rec.to_dict())))

    def records(self, mode: str | None = None, model: str | None = None
                ) -> list[TeacherRecord]:
        """Every stored record (of `mode` / teacher `model` when given), in key order: what
        `filtered_examples` reads when the answers were written elsewhere (another machine's
        run copied in) and no teacher generator is at hand to recompute the keys."""
        sql, args = "SELECT value FROM teacher", []
        conds = [(c, v) for c, v in (("mode", mode), ("model", model)) if v is not None]
        if conds:
            sql += " WHERE " + " AND ".join(f"{c} = ?" for c, _ in conds)
            args = [v for _, v in conds]
        out = []
        for (value,) in self._conn().execute(sql + " ORDER BY key", args):
            d = json.loads(value)
            out.append(TeacherRecord(**{**d, "citations": tuple(d["citations"])}))
        return out

    def __len__(self) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM teacher").fetchone()[0])


def score(text: str, citations: Sequence[int], ex: SFTExample) -> tuple[float, float]:
    """(answer F1 vs gold, citation precision vs gold positions; 0 when nothing is cited)."""
    f1 = best_em_f1(text, list(ex.answers))[1] if ex.answers else 0.0
    cited, gold = set(citations), set(ex.gold_positions)
    return float(f1), (len(cited & gold) / len(cited) if cited else 0.0)


def teacher_answers(teacher: Generator, examples: Sequence[SFTExample], mode: str, *,
                    prompt_id: str = "cite_concise", max_new_tokens: int = 32,
                    store: TeacherStore | None = None, budget_s: float | None = None,
                    log=None) -> list[TeacherRecord]:
    """Records for `examples` in order: cached ones read back, missing ones generated and
    stored, until `budget_s` seconds of generation have passed (the rest are left out; run
    again to continue)."""
    store = store if store is not None else TeacherStore()  # an empty store is falsy (__len__)
    fp = teacher.fingerprint or teacher.name
    out, t0 = [], time.perf_counter()
    for ex in examples:
        key = teacher_key(fp, prompt_id, ex, max_new_tokens)
        rec = store.get(key)
        if rec is None:
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                break
            t1 = time.perf_counter()
            g = teacher.generate(ex.question, list(ex.contexts), prompt_id, max_new_tokens)
            f1, prec = score(g.text, g.citations, ex)
            rec = TeacherRecord(key, ex.id, mode, teacher.name, g.raw, g.text,
                                tuple(g.citations), f1, prec, time.perf_counter() - t1,
                                prompt_id, max_new_tokens)
            store.put(rec)
            if log:
                log(f"[teacher] {ex.id} f1 {f1:.2f} cite {prec:.2f} ({rec.seconds:.1f} s)")
        out.append(rec)
    return out


def keep_record(rec: TeacherRecord, min_f1: float | None = None,
                min_cite_precision: float = 1.0) -> bool:
    """Keep a teacher answer for SFT: non-empty, cites something, F1 >= min_f1 (the record's
    mode's, `MODES`, unless given; 0.5 for a mode this version does not know) and citation
    precision >= min_cite_precision."""
    if min_f1 is None:
        min_f1 = MODES.get(rec.mode, ModeSpec()).min_f1
    return bool(rec.text.strip()) and bool(rec.citations) and rec.f1 >= min_f1 \
        and rec.cite_precision >= min_cite_precision


def filtered_examples(examples: Sequence[SFTExample], records: Sequence[TeacherRecord],
                      min_f1: float | None = None, min_cite_precision: float = 1.0
                      ) -> list[SFTExample]:
    """The teacher's kept answers as SFT examples (target `<answer> [i][j]`, source
    "teacher"), matched to `examples` by question id."""
    by_id = {e.id: e for e in examples}
    out = []
    for r in records:
        e = by_id.get(r.qid)
        if e is None or not keep_record(r, min_f1, min_cite_precision):
            continue
        out.append(SFTExample(e.id, e.question, e.contexts, format_target(r.text, r.citations),
                              "teacher", e.answers, tuple(r.citations),
                              {**e.meta, "teacher": r.model, "mode": r.mode, "f1": r.f1}))
    return out


def stored_teacher_examples(examples: Sequence[SFTExample], store: TeacherStore,
                            mode: str, model: str = TEACHER, min_f1: float | None = None,
                            min_cite_precision: float = 1.0
                            ) -> tuple[list[SFTExample], dict[str, int]]:
    """The kept teacher answers of `mode` already in `store` (written by any machine) as SFT
    examples over `examples` (the same `teacher_examples(mode, n)` the teacher answered), and
    counts. A record is used only when re-scoring it against this machine's example gives
    the stored F1 and citation precision: a retrieval that put the gold paragraphs elsewhere
    would make its `[i]` citations point at other passages (counted as `mismatched`); a
    question answered twice (another key) uses its first record by key. A record asked with
    another prompt or token budget than the mode's (`MODES`; a store can hold both after the
    mode's prompt changed) is not used (counted as `other_prompt`). `min_f1`: the mode's
    unless given."""
    spec = mode_spec(mode)
    min_f1 = spec.min_f1 if min_f1 is None else min_f1
    by_id = {e.id: e for e in examples}
    seen: dict[str, TeacherRecord] = {}
    counts = {"records": 0, "unknown_question": 0, "other_prompt": 0, "mismatched": 0,
              "duplicate": 0}
    for r in store.records(mode=mode, model=model):
        counts["records"] += 1
        e = by_id.get(r.qid)
        if r.prompt_id not in (None, spec.prompt_id) or \
                r.max_new_tokens not in (None, spec.max_new_tokens):
            counts["other_prompt"] += 1
        elif e is None:
            counts["unknown_question"] += 1
        elif r.qid in seen:
            counts["duplicate"] += 1
        elif any(abs(a - b) > 1e-9 for a, b in zip(score(r.text, r.citations, e),
                                                  (r.f1, r.cite_precision), strict=True)):
            counts["mismatched"] += 1
        else:
            seen[r.qid] = r
    recs = [seen[e.id] for e in examples if e.id in seen]
    kept = filtered_examples(examples, recs, min_f1, min_cite_precision)
    counts.update(used=len(recs), kept=len(kept))
    return kept, counts


def teacher_examples(mode: str, n: int, seed: int = 0) -> list[SFTExample]:
    """The first `n` HotpotQA train questions with `mode` contexts, or the first `n`
    answer-holding MTRAG train tasks for "mtrag-gold" (module docstring)."""
    from rl.adaptation.sft_data import hotpot_split, mtrag_split

    if mode_spec(mode).dataset == "mtrag":
        return mtrag_split(n, seed=seed)
    gold = hotpot_split("train", n, n_distractors=1, seed=seed)
    if mode == "gold":
        return gold
    from rag.config import RAGConfig
    from rag.corpus.loaders import load_hotpotqa
    from rag.indexset import IndexSet
    from rag.pipeline import Pipeline
    from rl.adaptation.sft_data import hotpot_path

    data = load_hotpotqa(hotpot_path(), pooled=True)
    root = cache_dir() / "bench" / f"hotpotqa-{data.corpus.fingerprint()}"
    idx = IndexSet.open(root) if (root / "corpus.jsonl").exists() else IndexSet.create(
        data.corpus, root, manifest={"dataset": "hotpotqa"})
    pipe = Pipeline(idx, RAGConfig())
    golds = {e.id: set(e.gold_passage_ids) for e in data.examples}
    out = []
    for e in gold:
        _, ctxs, _ = pipe.retrieve(e.question)
        pos = tuple(k for k, c in enumerate(ctxs, 1) if c.id in golds.get(e.id, ()))
        out.append(SFTExample(e.id, e.question, tuple(ctxs), format_target(e.answers[0], pos),
                              "hotpotqa", e.answers, pos, {**e.meta, "contexts": "hybrid"}))
    return out


def _shard(model: str, mode: str, n: int, k: int, shards: int, budget_s: float | None,
           store_path: str | None) -> int:
    """One Ray task (or the whole job when shards == 1): questions k, k+shards, ..."""
    from rag.generation.factory import make_generator

    spec = mode_spec(mode)
    exs = teacher_examples(mode, n)[k::shards]
    gen = make_generator(model, cache=False)
    recs = teacher_answers(gen, exs, mode, prompt_id=spec.prompt_id,
                           max_new_tokens=spec.max_new_tokens, store=TeacherStore(store_path),
                           budget_s=budget_s, log=lambda m: print(m, flush=True))
    return len(recs)


def run_teacher_job(model: str = TEACHER, mode: str = "gold", n: int = 500, shards: int = 1,
                    budget_s: float | None = None, store_path: str | None = None) -> int:
    """Answers for the first `n` train questions; `shards > 1` fans out as Ray tasks."""
    if shards <= 1:
        return _shard(model, mode, n, 0, 1, budget_s, store_path)
    import ray

    from rl.common.runtime import init_ray

    init_ray()
    task = ray.remote(num_cpus=1)(_shard)
    return sum(ray.get([task.remote(model, mode, n, k, shards, budget_s, store_path)
                        for k in range(shards)]))


def export_sets(out_dir: str | Path, n: int = 500, store_path: str | None = None,
                model: str = TEACHER, modes: Sequence[str] = ("gold", "hybrid")) -> dict:
    """Write the distillation SFT sets (`sft_data.distillation_sets`) of the kept stored
    answers of `modes` over the first `n` train questions: <out>/teacher.jsonl and
    <out>/teacher+gold.jsonl (gold = the examples of the modes' dataset's `GOLD_MODES` mode;
    the modes must all be of one dataset), + counts."""
    from rl.adaptation.sft_data import distillation_sets, save_examples

    datasets = {mode_spec(m).dataset for m in modes}
    if len(datasets) != 1:
        raise ValueError(f"modes {list(modes)}: give the modes of one dataset (HotpotQA and "
                         "MTRAG are exported apart)")
    gold_mode = GOLD_MODES[datasets.pop()]
    store = TeacherStore(store_path)
    gold = teacher_examples(gold_mode, n)
    kept: list[SFTExample] = []
    counts = {}
    for mode in modes:
        exs = gold if mode == gold_mode else teacher_examples(mode, n)
        k, c = stored_teacher_examples(exs, store, mode, model)
        kept += k
        counts[mode] = c
    out = Path(out_dir)
    sets = distillation_sets(gold, kept)
    for name, exs in sets.items():
        save_examples(exs, out / f"{name}.jsonl")
    summary = {"counts": counts, "sets": {k: len(v) for k, v in sets.items()},
               "out": str(out)}
    (out / "sets.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _at_least_one(value: str) -> int:
    """argparse type of a count flag (argparse then exits 2 naming the flag)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def main() -> None:
    from rag.env import configure_runtime_env

    configure_runtime_env()
    ap = argparse.ArgumentParser(description="teacher answers for HotpotQA or MTRAG train "
                                             "questions")
    ap.add_argument("--model", default=TEACHER)
    ap.add_argument("--mode", choices=list(MODES), default="gold")
    ap.add_argument("--n", type=_at_least_one, default=500)
    ap.add_argument("--shards", type=_at_least_one, default=1)
    ap.add_argument("--budget-s", type=float)
    ap.add_argument("--store")
    ap.add_argument("--export-sets", metavar="DIR",
                    help="write the distillation SFT sets of the stored answers to DIR "
                         "instead of answering (HotpotQA: both modes; --mode mtrag-gold: MTRAG's)")
    a = ap.parse_args()
    if a.export_sets:
        modes = tuple(m for m, s in MODES.items() if s.dataset == MODES[a.mode].dataset)
        print(json.dumps(export_sets(a.export_sets, a.n, a.store, a.model, modes)))
        return
    done = run_teacher_job(a.model, a.mode, a.n, a.shards, a.budget_s, a.store)
    print(json.dumps({"answers": done, "store": str(TeacherStore(a.store).path)}))


if __name__ == "__main__":
    main()
