"""Supervised fine-tuning data for the generator, in the project's citation answer format.

A target is exactly what `rag.generation.parse` reads back: `<short answer> [i][j]`, with i, j the
1-based positions of the supporting passages in the prompt. Three sources:

* HotpotQA (train split of configs/splits/hotpotqa.json only; valid/test ids are refused):
  question + the two gold paragraphs (+ distractors from the same record), shuffled, each trimmed
  to `max_context_chars` around its supporting sentences so prompts stay short (CPU cost is
  linear in tokens), target = gold answer + citations of the gold paragraphs.
* MTRAG (train split of configs/splits/mtrag.json only): the tasks whose gold holds an answer
  (answerability ANSWERABLE or PARTIAL, at least one gold passage); question = the last user
  turn (what the pipeline's generator answers), contexts = up to `max_gold` gold passages and
  `n_distractors` gold passages of other conversations of the same collection, shuffled, each
  cut at a sentence end to `max_context_chars`; target = the reference answer + citations.
* The interaction log: `ragpilot export-interactions` JSONL (serving.store.export_jsonl layout:
  question, context_ids, citations, answer, reward, shadow, ...). Rows rated >= `min_reward`
  become examples; context ids are resolved against a passage lookup (the index's corpus).
  Read from the file, never through serving (rl must not import serving).
* Teacher distillation: any `rag.generation.base.Generator` (an OpenAI-compatible endpoint via
  `rag.generation.openai_compat.OpenAIChatGenerator`) answers the prompts; answers that cite
  nothing, abstain, or (when gold exists) score F1 below `min_f1` are dropped. The cached,
  resumable Qwen teacher lives in `rl.adaptation.teacher`; `distillation_sets` turns its kept
  answers into the teacher-only and teacher+gold sets.

`examples_manifest(examples)` describes the examples a run actually used (dataset, split, count,
hashes of their ids and contents, the input files with sha256) for `rag.provenance` tags.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.corpus.loaders import iter_jsonl
from rag.errors import ConfigError, DataError
from rag.generation.base import Generator
from rag.generation.prompts import INSUFFICIENT
from rag.metrics.qa import best_em_f1
from rag.types import Context, Passage, conversation_of

TRAIN_SPLITS = ("train",)
"""The only split ids SFT may read (valid picks the `best` checkpoint, test reports)."""


@dataclass(frozen=True)
class SFTExample:
    """One prompt (question + numbered contexts) and the completion to learn."""

    id: str
    question: str
    contexts: tuple[Context, ...]
    target: str
    source: str = "hotpotqa"
    answers: tuple[str, ...] = ()
    gold_positions: tuple[int, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "question": self.question, "target": self.target,
                "source": self.source, "answers": list(self.answers),
                "gold_positions": list(self.gold_positions),
                "contexts": [c.to_dict() for c in self.contexts], "meta": self.meta}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SFTExample:
        return cls(id=str(d["id"]), question=d["question"], target=d["target"],
                   source=d.get("source", "hotpotqa"), answers=tuple(d.get("answers") or ()),
                   gold_positions=tuple(int(i) for i in d.get("gold_positions") or ()),
                   contexts=tuple(Context(**c) for c in d["contexts"]),
                   meta=dict(d.get("meta") or {}))


def format_target(answer: str, citations: Iterable[int]) -> str:
    """`Paris [1][2]`: the completion format `rag.generation.parse.parse_output` reads back."""
    cites = "".join(f"[{i}]" for i in dict.fromkeys(citations))
    return f"{answer.strip()} {cites}".strip()


def trim_sentences(sentences: Sequence[str], keep: Iterable[int], max_chars: int) -> str:
    """The paragraph with its `keep` (supporting) sentences always included, then the other
    sentences nearest to them, in original order, while the text fits `max_chars` (exceeded only
    when the supporting sentences alone are longer: they are never cut)."""
    sents = [s.strip() for s in sentences]
    keep_set = {i for i in keep if 0 <= i < len(sents)}
    if not keep_set:
        keep_set = {0} if sents else set()
    chosen = set(keep_set)
    size = sum(len(sents[i]) + 1 for i in chosen)
    anchors = sorted(keep_set)
    others = sorted((i for i in range(len(sents)) if i not in chosen),
                    key=lambda i: (min(abs(i - a) for a in anchors), i))
    for i in others:
        if size + len(sents[i]) + 1 > max_chars:
            break
        chosen.add(i)
        size += len(sents[i]) + 1
    return " ".join(sents[i] for i in sorted(chosen) if sents[i])


def _check_count(n: int | None) -> None:
    """`n` questions of a split: None (all) or >= 1 (a slice `[:n]` would read 0 or -1 as
    "all but the last")."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ConfigError("n", f"must be a whole number >= 1 (or none for all), got {n!r}")


def _check_split(ids: Iterable[str], allowed: set[str], what: str) -> None:
    bad = [i for i in ids if i not in allowed]
    if bad:
        raise ConfigError(what, f"{len(bad)} id(s) are not in the train split (e.g. {bad[0]!r}); "
                                "SFT never trains on valid/test questions")


def hotpot_sft_examples(path: str | Path, train_ids: Iterable[str], *, n_distractors: int = 1,
                        max_context_chars: int = 600, seed: int = 0,
                        limit: int | None = None, split_ids: Mapping[str, Iterable[str]]
                        | None = None, trim: bool = True) -> list[SFTExample]:
    """SFT examples from HotpotQA records whose id is in `train_ids` (HF or official layout).

    `split_ids` (the manifest's splits) makes the train-only rule explicit: every requested id
    must belong to its "train" split, else ConfigError("train_ids"). Evaluation sets are built
    with the same function, `split_ids=None` and `trim=False` (whole paragraphs: trimming around
    supporting sentences would leak gold information into a test prompt)."""
    wanted = list(dict.fromkeys(train_ids))
    if split_ids is not None:
        _check_split(wanted, set(split_ids.get("train", ())), "train_ids")
    order = {qid: k for k, qid in enumerate(wanted)}
    rng = random.Random(seed)
    out: list[tuple[int, SFTExample]] = []
    for n, rec in iter_jsonl(path):
        qid = str(rec.get("id") or rec.get("_id") or "")
        if qid not in order:
            continue
        try:
            ctx, sf = rec["context"], rec["supporting_facts"]
            if isinstance(ctx, dict):
                paras = list(zip(ctx["title"], ctx["sentences"], strict=True))
                facts = list(zip(sf["title"], sf["sent_id"], strict=True))
            else:
                paras = [(t, s) for t, s in ctx]
                facts = [(t, int(i)) for t, i in sf]
            question, answer = rec["question"], str(rec["answer"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(str(path), f"bad HotpotQA record ({exc})", line=n) from None
        keep: dict[str, list[int]] = {}
        for t, i in facts:
            keep.setdefault(t, []).append(int(i))
        gold = [(t, s) for t, s in paras if t in keep]
        distract = [(t, s) for t, s in paras if t not in keep]
        rng.shuffle(distract)
        chosen = gold + distract[:n_distractors]
        rng.shuffle(chosen)
        contexts = tuple(Context(f"{qid}:{k}", t,
                                 trim_sentences(s, keep.get(t, [0]), max_context_chars) if trim
                                 else " ".join(x.strip() for x in s))
                         for k, (t, s) in enumerate(chosen))
        gold_pos = tuple(k + 1 for k, (t, _) in enumerate(chosen) if t in keep)
        out.append((order[qid], SFTExample(qid, question, contexts,
                                           format_target(answer, gold_pos), "hotpotqa",
                                           (answer,), gold_pos, {"type": rec.get("type")})))
    out.sort(key=lambda t: t[0])
    examples = [e for _, e in out]
    return examples[:limit] if limit is not None else examples


def hotpot_path() -> Path:
    from rag.corpus.loaders import data_root

    return data_root() / "hotpotqa" / "hotpot_dev_distractor_1100.jsonl"


def hotpot_split(split: str, n: int | None = None, *, n_distractors: int = 0,
                 max_context_chars: int = 600, seed: int = 0) -> list[SFTExample]:
    """Examples of one split of configs/splits/hotpotqa.json. "train": trimmed contexts with
    distractors (training); any other split: whole gold paragraphs only (evaluation)."""
    from rag.corpus.hygiene import load_split

    _check_count(n)
    manifest = load_split("hotpotqa")
    ids = manifest.ids(split)[:n]
    if split in TRAIN_SPLITS:
        return hotpot_sft_examples(hotpot_path(), ids, n_distractors=n_distractors,
                                   max_context_chars=max_context_chars, seed=seed,
                                   split_ids=manifest.splits)
    return hotpot_sft_examples(hotpot_path(), ids, n_distractors=n_distractors, seed=seed,
                               trim=False)


MTRAG_ANSWERED = frozenset({"answerable", "partial"})
"""MTRAG answerability labels (lower-cased) whose reference is an answer to learn; UNANSWERABLE
and UNDERSPECIFIED references are an abstention or a clarifying question instead."""


def cut_at_sentence(text: str, max_chars: int) -> str:
    """`text`'s leading sentences while they fit `max_chars` (at least the first sentence, itself
    cut at `max_chars` when longer): a passage shortened for a CPU prompt without a half
    sentence at its end."""
    import re

    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    out = ""
    for sent in re.split(r"(?<=[.!?])\s+", text):
        if out and len(out) + 1 + len(sent) > max_chars:
            break
        out = f"{out} {sent}".strip() if out else sent
    return out[:max_chars]


def mtrag_path() -> Path:
    from rag.corpus.loaders import MTRAG_FILE, data_root

    return data_root() / MTRAG_FILE


def mtrag_sft_examples(path: str | Path, train_ids: Iterable[str], *, max_gold: int = 2,
                       n_distractors: int = 1, max_context_chars: int = 700, seed: int = 0,
                       split_ids: Mapping[str, Iterable[str]] | None = None
                       ) -> list[SFTExample]:
    """SFT examples from the MTRAG generation tasks whose id is in `train_ids` and whose gold
    holds an answer (module docstring), in `train_ids` order. `split_ids` (the manifest's
    splits): every requested id must belong to its "train" split, else ConfigError. An id
    that is not a task of the file is a DataError (never silently fewer examples)."""
    from rag.corpus.loaders import load_mtrag

    wanted = list(dict.fromkeys(train_ids))
    if split_ids is not None:
        _check_split(wanted, set(split_ids.get("train", ())), "train_ids")
    data = load_mtrag(path)
    by_id = {e.id: e for e in data.examples}
    missing = [i for i in wanted if i not in by_id]
    if missing:
        raise DataError(str(path), f"{len(missing)} requested task id(s) are not in the file "
                                   f"(e.g. {missing[0]!r})")
    conv = {e.id: conversation_of(e) for e in data.examples}
    pool: dict[str, list[tuple[str, str]]] = {}  # collection -> (conversation, passage id)
    for e in data.examples:
        for pid in e.gold_passage_ids:
            pool.setdefault(str(e.metadata.get("collection")), []).append((conv[e.id], pid))
    rng = random.Random(seed)
    out = []
    for qid in wanted:
        e = by_id[qid]
        label = str(e.metadata.get("answerability") or "").strip().lower()
        if label not in MTRAG_ANSWERED or not e.gold_passage_ids or not e.answers:
            continue
        gold = list(e.gold_passage_ids[:max_gold])
        others = sorted({pid for c, pid in pool.get(str(e.metadata.get("collection")), ())
                         if c != conv[qid] and pid not in e.gold_passage_ids})
        chosen = gold + rng.sample(others, min(n_distractors, len(others)))
        rng.shuffle(chosen)
        contexts = tuple(Context(pid, data.corpus[pid].title,
                                 cut_at_sentence(data.corpus[pid].text, max_context_chars))
                         for pid in chosen)
        gold_pos = tuple(k for k, pid in enumerate(chosen, 1) if pid in gold)
        out.append(SFTExample(qid, e.question, contexts, format_target(e.answers[0], gold_pos),
                              "mtrag", e.answers, gold_pos,
                              {"answerability": label, "collection": e.metadata.get("collection"),
                               "turn": e.metadata.get("turn")}))
    return out


def mtrag_split(n: int | None = None, *, max_gold: int = 2, n_distractors: int = 1,
                max_context_chars: int = 700, seed: int = 0) -> list[SFTExample]:
    """The first `n` answer-holding tasks of the train split of configs/splits/mtrag.json (the
    only MTRAG split SFT and teacher data may read)."""
    from rag.corpus.hygiene import load_split

    _check_count(n)
    manifest = load_split("mtrag")
    exs = mtrag_sft_examples(mtrag_path(), manifest.ids("train"), max_gold=max_gold,
                             n_distractors=n_distractors, max_context_chars=max_context_chars,
                             seed=seed, split_ids=manifest.splits)
    return exs[:n] if n is not None else exs


def log_sft_examples(path: str | Path, passages: Mapping[str, Passage], *,
                     min_reward: float = 0.7, include_shadow: bool = False,
                     max_context_chars: int = 600) -> list[SFTExample]:
    """Positively rated interactions of an exported log (one JSON object per line).

    Skipped: unrated rows, rewards below `min_reward`, shadow rows (never shown to a user),
    abstentions, and rows whose context ids are not all in `passages`. A row missing a
    required field raises DataError(path, line)."""
    if not 0.0 <= min_reward <= 1.0:
        raise ConfigError("min_reward", "must lie in [0, 1]")
    out: list[SFTExample] = []
    for n, rec in iter_jsonl(path):
        for key in ("id", "question", "answer", "context_ids"):
            if key not in rec:
                raise DataError(str(path), f"missing field {key!r}", line=n)
        reward = rec.get("reward")
        if reward is None or float(reward) < min_reward:
            continue
        if rec.get("shadow") and not include_shadow:
            continue
        answer = str(rec["answer"]).strip()
        if not answer or answer.lower() == INSUFFICIENT:
            continue
        ids = list(rec["context_ids"] or [])
        if not ids or any(i not in passages for i in ids):
            continue
        ctxs = tuple(Context(i, passages[i].title, passages[i].text[:max_context_chars])
                     for i in ids)
        cites = [int(c) for c in rec.get("citations") or [] if 1 <= int(c) <= len(ids)]
        out.append(SFTExample(str(rec["id"]), rec["question"], ctxs,
                              format_target(answer, cites), "log", (), tuple(cites),
                              {"reward": float(reward), "variant_id": rec.get("variant_id")}))
    return out


def teacher_sft_examples(examples: Sequence[SFTExample], teacher: Generator, *,
                         prompt_id: str = "cite_concise", min_f1: float = 0.5,
                         max_new_tokens: int = 48) -> list[SFTExample]:
    """Distillation: the teacher answers each example's prompt; its answer (with its own
    citations) replaces the target. Dropped: abstentions, answers without a citation, and,
    where gold answers exist, answers with F1 < `min_f1` (a wrong teacher teaches nothing)."""
    gens = teacher.generate_batch([e.question for e in examples],
                                  [list(e.contexts) for e in examples], prompt_id,
                                  max_new_tokens=max_new_tokens)
    out = []
    for e, g in zip(examples, gens, strict=True):
        if not g.text or g.text == INSUFFICIENT or not g.citations:
            continue
        if e.answers and best_em_f1(g.text, e.answers)[1] < min_f1:
            continue
        out.append(SFTExample(e.id, e.question, e.contexts, format_target(g.text, g.citations),
                              "teacher", e.answers, tuple(g.citations),
                              {**e.meta, "teacher": teacher.name}))
    return out


def distillation_sets(gold: Sequence[SFTExample], teacher: Sequence[SFTExample]
                      ) -> dict[str, list[SFTExample]]:
    """The two distillation SFT sets from gold-target examples and the kept
    teacher answers (`rl.adaptation.teacher.filtered_examples`):
    "teacher"       the teacher's answers only;
    "teacher+gold"  every gold example, then every kept teacher answer (as the CLI's
                    `data.teacher` adds them): the student sees the gold target and, where
                    the teacher was right, its phrasing and citations too."""
    return {"teacher": list(teacher), "teacher+gold": [*gold, *teacher]}


def save_examples(examples: Sequence[SFTExample], path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as f:
        for e in examples:
            f.write(json.dumps(e.to_dict(), ensure_ascii=False) + "\n")


def load_examples(path: str | Path) -> list[SFTExample]:
    out = []
    for n, rec in iter_jsonl(path):
        try:
            out.append(SFTExample.from_dict(rec))
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(str(path), f"bad SFT example ({exc})", line=n) from None
    return out


# --------------------------------------------------------------------------- provenance


def _sha256_lines(lines: Iterable[str]) -> str:
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def hotpot_inputs() -> list[dict[str, str]]:
    """The files HotpotQA examples come from: the split manifest (which ids are train) and the
    records, each with its sha256 (paths relative to the repo / the dataset root)."""
    from rag.corpus.hygiene import SPLITS_DIR
    from rag.corpus.loaders import sha256_file

    split = SPLITS_DIR / "hotpotqa.json"
    data = hotpot_path()
    return [{"path": "configs/splits/hotpotqa.json", "sha256": sha256_file(split)},
            {"path": f"hotpotqa/{data.name}", "sha256": sha256_file(data)}]


def hotpot_inputs_if_train(ids: Sequence[str]) -> list[dict[str, str]]:
    """`hotpot_inputs()` when every id is in the train split of configs/splits/hotpotqa.json
    (so the examples did come from those files), else [] (also when the data is absent)."""
    from rag.corpus.hygiene import load_split

    try:
        train = set(load_split("hotpotqa").ids("train"))
        return hotpot_inputs() if ids and set(ids) <= train else []
    except (DataError, ConfigError, OSError):
        return []


def examples_manifest(examples: Sequence[SFTExample], split: str = "train",
                      inputs: Sequence[Mapping[str, str]] | None = None,
                      dataset: str | None = None, **extra: Any) -> dict[str, Any]:
    """The dataset manifest of the examples a run used (the `manifest` of
    `rag.provenance.provenance_tags`): dataset (the sources joined with '+', unless given),
    split, example count per source, sha256 of the ordered ids and of the examples' full
    content (prompt contexts and targets), and the input files (`inputs`; by default the
    HotpotQA files when every example is a HotpotQA train-split question, else none)."""
    by_source: dict[str, int] = {}
    for e in examples:
        by_source[e.source] = by_source.get(e.source, 0) + 1
    if inputs is None:
        inputs = hotpot_inputs_if_train([e.id for e in examples]) \
            if by_source and set(by_source) == {"hotpotqa"} else []
    return {"dataset": dataset or "+".join(sorted(by_source)) or "none", "split": split,
            "examples": len(examples), "sources": dict(sorted(by_source.items())),
            "ids_sha256": _sha256_lines(e.id for e in examples),
            "examples_sha256": _sha256_lines(json.dumps(e.to_dict(), sort_keys=True,
                                                        ensure_ascii=False) for e in examples),
            "inputs": [dict(i) for i in inputs], **extra}
