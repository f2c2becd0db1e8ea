"""Perturbation suite for faithfulness: a gold answer with its gold contexts, and four ways to
make it unfaithful while keeping it fluent and on topic.

  swapped_entity     one name or number of the answer replaced by one of the same kind that
                     occurs nowhere in the contexts (a name from another item, or a year/number
                     shifted until it is absent)
  negation           the first sentence with an auxiliary verb gets "not" after it ("was" ->
                     "was not"); else "never" before its first past-tense verb
  distractor_answer  the answer replaced by the opening sentences of a distractor passage (a
                     passage that is not gold for this question: HotpotQA's distractor
                     paragraphs, another MTRAG task's passage)
  added_claim        the gold answer plus one sentence taken from a distractor passage

`make_cases(items, n)` builds `n` cases, the four kinds in turn, from `SourceItem`s (seeded,
deterministic); `run_suite(scorer, cases)` scores original and perturbed answer against the
same gold contexts. A case *passes* when the perturbed faithfulness is strictly lower than the
original's (a missing perturbed value, i.e. no claim left, fails). Why these four: they are the
errors a lexical/embedding support score is most likely to miss (the words stay on topic), and
they mirror what RAG generators actually do wrong (wrong entity, flipped polarity, answering
from the wrong passage, padding with unsupported facts).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rag.metrics.claims import STOPWORDS, split_sentences
from rag.metrics.qa import normalize_answer
from rag.types import Answer, Context

__all__ = ["PERTURBATIONS", "SourceItem", "PerturbedCase", "SuiteResult", "negate",
           "swap_entity", "find_entities", "make_cases", "run_suite"]

PERTURBATIONS = ("swapped_entity", "negation", "distractor_answer", "added_claim")

_AUX = ("is", "are", "was", "were", "has", "have", "had", "can", "could", "will", "would",
        "should", "may", "might", "must", "does", "do", "did")
_AUX_RE = re.compile(r"\b(" + "|".join(_AUX) + r")\b(?!\s+(?:not|n't|never)\b)", re.I)
_PAST_RE = re.compile(r"(?<=\s)([a-z]{3,}ed)\b")
_NUM_RE = re.compile(r"\b\d{1,3}(?:,\d{3})+\b|\b\d+(?:\.\d+)?\b")
_CAP_RUN = re.compile(r"\b[A-Z][\w'&.-]*(?:\s+(?:of|the|de|da|von|van|and|'n)?\s*[A-Z][\w'&.-]*)*")


@dataclass(frozen=True)
class SourceItem:
    """A gold answer with its gold contexts, and passages that are not gold for it."""

    id: str
    question: str
    answer: str
    contexts: tuple[Context, ...]
    distractors: tuple[Context, ...] = ()
    dataset: str = ""


@dataclass(frozen=True)
class PerturbedCase:
    id: str
    kind: str
    dataset: str
    question: str
    contexts: tuple[Context, ...]
    original: str
    perturbed: str

    def answers(self) -> tuple[Answer, Answer]:
        return (Answer(f"{self.id}:gold", self.question, self.original, (), self.contexts, (),
                       {}, 0, 0, "gold"),
                Answer(f"{self.id}:{self.kind}", self.question, self.perturbed, (),
                       self.contexts, (), {}, 0, 0, self.kind))


def grounded_order(sentences: Sequence[str], contexts: Sequence[Context]) -> list[int]:
    """Sentence indices, most grounded first: by the share of a sentence's content stems found
    in the contexts (lexical only, independent of the support scorer). Perturbing the most
    grounded sentence changes a fact the answer took from the passages, not a sentence that
    was unsupported to begin with ("Yes, you are correct.")."""
    from rag.metrics.claims import content_tokens

    pool = {t for c in contexts for t in content_tokens(f"{c.title} {c.text}")}

    def share(s: str) -> float:
        toks = set(content_tokens(s))
        return sum(t in pool for t in toks) / len(toks) if toks else 0.0

    return sorted(range(len(sentences)), key=lambda i: (-share(sentences[i]), i))


def negate(text: str, contexts: Sequence[Context] = ()) -> str | None:
    """Negate one sentence that has an auxiliary verb (or a past-tense verb) and no negation
    yet (a double negation is ambiguous): the most grounded one when `contexts` are given,
    else the first. None when no sentence qualifies."""
    from rag.metrics.claims import has_negation

    sents = split_sentences(text)
    order = grounded_order(sents, contexts) if contexts else range(len(sents))
    for i in order:
        s = sents[i]
        if has_negation(s):
            continue
        m = _AUX_RE.search(s)
        if m is not None and not re.search(r"\b(not|never|n't)\b", s[m.end():m.end() + 8]):
            new = s[:m.end()] + " not" + s[m.end():]
        else:
            m = _PAST_RE.search(s)
            if m is None:
                continue
            new = s[:m.start()] + "never " + s[m.start():]
        return " ".join([*sents[:i], new, *sents[i + 1:]])
    return None


def find_entities(text: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of names (capitalised runs, not a sentence's first word unless it is
    a run of 2+ words) and numbers in `text`."""
    out: list[tuple[int, int, str]] = []
    starts = {0} | {m.end() for m in re.finditer(r"[.!?]\s+", text)}
    for m in _CAP_RUN.finditer(text):
        span = m.group(0).rstrip(".")
        first_word = m.start() in starts
        if first_word and " " not in span:
            continue
        if span.lower() in STOPWORDS or len(span) < 3:
            continue
        out.append((m.start(), m.start() + len(span), "name"))
    for m in _NUM_RE.finditer(text):
        if not any(s <= m.start() < e for s, e, _ in out):
            out.append((m.start(), m.end(), "number"))
    return sorted(out)


def _absent(candidate: str, context_norm: str) -> bool:
    toks = [t for t in normalize_answer(candidate).split() if t not in STOPWORDS]
    return bool(toks) and not any(f" {t} " in context_norm for t in toks)


def swap_entity(text: str, contexts: Sequence[Context], name_pool: Sequence[str],
                rng: random.Random) -> str | None:
    """Replace one name or number of `text` with one of the same kind absent from the contexts
    (numbers: shifted by 1..40 until absent; names: drawn from `name_pool`), in the most
    grounded sentence that has one (names before numbers)."""
    ctx_norm = " " + " ".join(normalize_answer(f"{c.title} {c.text}") for c in contexts) + " "
    sents = split_sentences(text)
    starts, pos = [], 0
    for snt in sents:
        k = text.find(snt[:20], pos)
        starts.append(k if k >= 0 else pos)
        pos = max(pos, starts[-1])
    rank = {i: r for r, i in enumerate(grounded_order(sents, contexts))}

    def sent_of(off: int) -> int:
        return max([i for i, st in enumerate(starts) if st <= off], default=0)

    ents = find_entities(text)
    rng.shuffle(ents)
    # most grounded sentence first; names first: the harder case for a lexical check
    ents.sort(key=lambda e: (rank.get(sent_of(e[0]), 0), e[2] != "name"))
    for s, e, kind in ents:
        old = text[s:e]
        if kind == "number":
            try:
                val = float(old.replace(",", ""))
            except ValueError:
                continue
            for _ in range(20):
                new_val = val + rng.choice([-1, 1]) * rng.randint(1, 40)
                if new_val < 0:
                    continue
                new = str(int(new_val)) if float(new_val).is_integer() else f"{new_val:.1f}"
                if _absent(new, ctx_norm):
                    return text[:s] + new + text[e:]
            continue
        cands = [n for n in name_pool if n != old and _absent(n, ctx_norm)]
        if cands:
            return text[:s] + rng.choice(cands) + text[e:]
    return None


def _opening(ctx: Context, n_sent: int) -> str:
    """The first `n_sent` sentences of a passage with at least 6 words (skips title lines)."""
    sents = [s for s in split_sentences(ctx.text) if len(s.split()) >= 6]
    return " ".join(sents[:max(1, n_sent)]).strip()


def make_cases(items: Sequence[SourceItem], n: int = 200, seed: int = 0,
               kinds: Sequence[str] = PERTURBATIONS) -> list[PerturbedCase]:
    """`n` cases, kinds in turn (n // len(kinds) each, the remainder to the first kinds), each
    kind drawing items in a seeded order and skipping items it cannot perturb. Items with no
    contexts or an empty answer are skipped."""
    bad = [k for k in kinds if k not in PERTURBATIONS]
    if bad:
        from rag.errors import ConfigError

        raise ConfigError("kinds", f"unknown perturbation {bad[0]!r} (known: "
                                   f"{', '.join(PERTURBATIONS)})")
    rng = random.Random(seed)
    items = [it for it in items if it.contexts and it.answer.strip()]
    names = sorted({it.answer[s:e] for it in items for s, e, k in find_entities(it.answer)
                    if k == "name"})
    quota = {k: n // len(kinds) + (i < n % len(kinds)) for i, k in enumerate(kinds)}
    out: list[PerturbedCase] = []
    for kind in kinds:
        order = list(items)
        random.Random(f"{seed}:{kind}").shuffle(order)
        made = 0
        for it in order:
            if made >= quota[kind]:
                break
            n_sent = len(split_sentences(it.answer))
            new: str | None = None
            if kind == "swapped_entity":
                new = swap_entity(it.answer, it.contexts, names, rng)
            elif kind == "negation":
                new = negate(it.answer, it.contexts)
            elif kind == "distractor_answer" and it.distractors:
                new = _opening(rng.choice(it.distractors), min(n_sent, 2))
            elif kind == "added_claim" and it.distractors:
                extra = _opening(rng.choice(it.distractors), 1)
                sep = "" if it.answer.rstrip().endswith((".", "!", "?")) else "."
                new = f"{it.answer.rstrip()}{sep} {extra}"
            if not new or normalize_answer(new) == normalize_answer(it.answer):
                continue
            out.append(PerturbedCase(f"{it.id}:{kind}", kind, it.dataset, it.question,
                                     it.contexts, it.answer, new))
            made += 1
    return out


@dataclass
class SuiteResult:
    cases: list[PerturbedCase]
    original: list[float | None]
    perturbed: list[float | None]
    passed: list[bool] = field(default_factory=list)

    def pass_rate(self, kind: str | None = None, dataset: str | None = None) -> float:
        sel = [p for c, p in zip(self.cases, self.passed, strict=True)
               if (kind is None or c.kind == kind) and (dataset is None or c.dataset == dataset)]
        return sum(sel) / len(sel) if sel else float("nan")

    def rows(self) -> list[dict]:
        return [{"id": c.id, "kind": c.kind, "dataset": c.dataset, "original": c.original,
                 "perturbed": c.perturbed, "faithfulness_original": o,
                 "faithfulness_perturbed": p, "passed": ok}
                for c, o, p, ok in zip(self.cases, self.original, self.perturbed, self.passed,
                                       strict=True)]


def run_suite(scorer, cases: Sequence[PerturbedCase]) -> SuiteResult:
    """Faithfulness of every original and perturbed answer (one scorer batch)."""
    pairs = [c.answers() for c in cases]
    rows = scorer.score_batch([a for p in pairs for a in p])
    orig = [rows[2 * i].get("faithfulness") for i in range(len(cases))]
    pert = [rows[2 * i + 1].get("faithfulness") for i in range(len(cases))]
    passed = [o is not None and p is not None and p < o for o, p in zip(orig, pert, strict=True)]
    return SuiteResult(list(cases), orig, pert, passed)


# ---- source items from the benchmark datasets ----------------------------------------------
def hotpotqa_items(path, ids: Sequence[str] | None = None) -> list[SourceItem]:
    """HotpotQA distractor records -> items: the answer is the supporting-fact sentences (the
    grounded explanation a RAG answer should give; the factoid gold answer appended when it is
    not in them), contexts the gold paragraphs, distractors the other 8 paragraphs."""
    from rag.corpus.loaders import _hotpot_records

    want = set(ids) if ids is not None else None
    out = []
    for _, _, rec in _hotpot_records(__import__("pathlib").Path(path)):
        qid = str(rec.get("id") or rec.get("_id"))
        if want is not None and qid not in want:
            continue
        ctx, sf = rec["context"], rec["supporting_facts"]
        paras = dict(zip(ctx["title"], ctx["sentences"], strict=True))
        facts = list(zip(sf["title"], sf["sent_id"], strict=True))
        sents = [paras[t][i].strip() for t, i in facts if t in paras and i < len(paras[t])]
        if not sents:
            continue
        answer = " ".join(sents)
        gold = str(rec["answer"])
        if gold.lower() not in ("yes", "no") and normalize_answer(gold) not in \
                normalize_answer(answer):
            answer += f" The answer is {gold}."
        gold_titles = list(dict.fromkeys(t for t, _ in facts))
        ctx = {t: Context(f"{qid}:{i}", t, " ".join(x.strip() for x in sents_))
               for i, (t, sents_) in enumerate(paras.items())}
        out.append(SourceItem(qid, rec["question"], answer,
                              tuple(ctx[t] for t in gold_titles if t in ctx),
                              tuple(c for t, c in ctx.items() if t not in gold_titles),
                              "hotpotqa"))
    return out


def mtrag_items(examples, corpus, ids: Sequence[str] | None = None) -> list[SourceItem]:
    """MTRAG generation tasks (rag.corpus.loaders.load_mtrag) -> items: the human reference
    answer, its gold passages, and as distractors the gold passages of two other answerable
    tasks (seeded by the task id). Tasks without a reference or passages are skipped, and so
    are abstentions and clarifying questions (a reference ending in "?"): not answers."""
    from rag.metrics.claims import is_noncommittal

    want = set(ids) if ids is not None else None
    usable = [e for e in examples if e.answers and e.gold_passage_ids
              and not is_noncommittal(e.answers[0]) and not e.answers[0].rstrip().endswith("?")]
    out = []
    for e in usable:
        if want is not None and e.id not in want:
            continue
        ctx = tuple(Context(p, corpus[p].title, corpus[p].text) for p in e.gold_passage_ids)
        others = [o for o in usable if not set(o.gold_passage_ids) & set(e.gold_passage_ids)]
        picks = random.Random(e.id).sample(others, min(2, len(others)))
        dis = tuple(Context(p, corpus[p].title, corpus[p].text) for o in picks
                    for p in o.gold_passage_ids[:1])
        out.append(SourceItem(e.id, e.question, e.answers[0], ctx, dis, "mtrag"))
    return out
