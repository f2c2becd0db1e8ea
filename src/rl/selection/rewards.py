"""Rewards of a selection episode, and the metrics the benchmark reports.

Final reward (at termination), weights from `selection.reward`:
    answer_f1    * F1 of the extractive reader's answer on the selected contexts (fast: the
                   reader is model-free, >= 500 answers/s)
  + support_f1   * set F1 of the selected passages vs the gold passages (training data only)
  + faithfulness * QualityScorer faithfulness of that answer (slow: off for training)
  + reward_model * tanh(distilled reward model score), when a model is saved under its name
  - passage_cost * number of selected passages
Step-wise shaping (`shaping: stepwise`): each pick earns
    shaping_weight * (mmr_lambda * relevance - (1 - mmr_lambda) * max cosine to the selected)
with relevance the min-max normalised cosine(query, passage) within the pool — MMR as a reward,
so the policy is paid for novelty as it goes rather than only at the end.

Every part is pluggable: a component with weight 0 is never computed, and a missing reward
model (a colleague's model not trained yet) is skipped with `has_reward_model = False`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rag.generation.extractive import ExtractiveReader
from rag.metrics.citation import redundancy_rate
from rag.metrics.qa import best_em_f1
from rag.types import Answer, Context, Generation
from rl.selection.config import RewardConfig
from rl.selection.features import Pool


def contexts_of(pool: Pool, selected: Sequence[int]) -> tuple[Context, ...]:
    return tuple(Context(pool.ids[j], pool.titles[j], pool.texts[j], float(pool.rel[j]))
                 for j in selected)


def set_prf(pred: set, gold: set) -> tuple[float, float, float]:
    tp = len(pred & gold)
    p = tp / len(pred) if pred else 0.0
    r = tp / len(gold) if gold else 0.0
    return (2 * p * r / (p + r) if p + r else 0.0), p, r


def load_optional_reward_model(name: str):
    """The saved reward model `name`, or None when none is saved (or it cannot be read)."""
    if not name:
        return None
    try:
        from rag.metrics.reward_model import load_reward_model

        return load_reward_model(name)
    except Exception:  # noqa: BLE001 - optional component: absent/incompatible means "not used"
        return None


class SelectionReward:
    """Final and step rewards (module docstring); final values are cached per selection."""

    def __init__(self, cfg: RewardConfig, reader=None, quality=None, reward_model=None,
                 load_reward_model: bool = True):
        self.cfg = cfg
        self.reader = reader or ExtractiveReader()
        self._quality = quality
        self._own_quality = quality is None  # built lazily here (not pickled: rebuilt)
        if reward_model is None and load_reward_model and cfg.reward_model > 0:
            reward_model = load_optional_reward_model(cfg.reward_model_name)
        self.reward_model = reward_model
        self._cache: dict[tuple[str, tuple[int, ...]], tuple[float, dict[str, float]]] = {}
        self._answers: dict[tuple[str, tuple[int, ...]], Generation] = {}

    def __getstate__(self) -> dict:
        """Pickled (e.g. as a Ray task argument) without the memo caches and a QualityScorer this
        object built itself: the copy recomputes them, with the same values."""
        state = dict(self.__dict__)
        state.update(_cache={}, _answers={})
        if state.get("_own_quality", True):
            state["_quality"] = None
        return state

    @property
    def has_reward_model(self) -> bool:
        return self.reward_model is not None

    @property
    def quality(self):
        if self._quality is None:
            from rag.metrics.quality import QualityScorer

            self._quality = QualityScorer(metrics=["faithfulness"])
        return self._quality

    def answer(self, pool: Pool, selected: Sequence[int]) -> Generation:
        key = (pool.qid, tuple(selected))
        if key not in self._answers:
            self._answers[key] = self.reader.generate(pool.question, contexts_of(pool, selected),
                                                      "cite_concise")
        return self._answers[key]

    def faithfulness(self, pool: Pool, selected: Sequence[int]) -> float:
        """QualityScorer faithfulness of the reader's answer; NaN where it is undefined
        (an abstention or a bare yes/no)."""
        g = self.answer(pool, selected)
        ans = Answer(pool.qid, pool.question, g.text, g.citations, contexts_of(pool, selected),
                     (), {}, g.tokens_in, g.tokens_out, "selection")
        return float(self.quality.score(ans, pool.example).get("faithfulness", math.nan))

    def final(self, pool: Pool, selected: Sequence[int]) -> tuple[float, dict[str, float]]:
        key = (pool.qid, tuple(selected))
        if key in self._cache:
            return self._cache[key]
        c = self.cfg
        parts: dict[str, float] = {}
        g = self.answer(pool, selected)
        total = -c.passage_cost * len(selected)
        if c.answer_f1 > 0 and pool.example.answers:
            parts["answer_f1"] = best_em_f1(g.text, pool.example.answers)[1]
            total += c.answer_f1 * parts["answer_f1"]
        if c.support_f1 > 0 and pool.example.gold_passage_ids:
            parts["support_f1"] = set_prf({pool.ids[j] for j in selected}, pool.gold_ids())[0]
            total += c.support_f1 * parts["support_f1"]
        if c.faithfulness > 0:
            f = self.faithfulness(pool, selected)
            parts["faithfulness"] = f
            total += c.faithfulness * (0.0 if math.isnan(f) else f)
        if c.reward_model > 0 and self.reward_model is not None:
            s = self.reward_model.score(pool.question, contexts_of(pool, selected), g.text)
            parts["reward_model"] = math.tanh(s)
            total += c.reward_model * parts["reward_model"]
        self._cache[key] = (float(total), parts)
        return self._cache[key]

    def step(self, pool: Pool, selected_before: Sequence[int], pick: int) -> float:
        """MMR shaping of one pick (0 when shaping is final_only)."""
        c = self.cfg
        if c.shaping != "stepwise" or c.shaping_weight == 0:
            return 0.0
        lo, hi = float(pool.rel.min()), float(pool.rel.max())
        rel = (float(pool.rel[pick]) - lo) / (hi - lo) if hi - lo > 1e-9 else 1.0
        sim = float((pool.emb[list(selected_before)] @ pool.emb[pick]).max()) \
            if selected_before else 0.0
        return c.shaping_weight * (c.mmr_lambda * rel - (1.0 - c.mmr_lambda) * sim)

    def episode_return(self, pool: Pool, selected: Sequence[int]) -> float:
        """Sum of the step rewards and the final reward of a complete selection."""
        total = sum(self.step(pool, selected[:t], j) for t, j in enumerate(selected))
        return total + self.final(pool, selected)[0]


def selection_metrics(rw: SelectionReward, pool: Pool, selected: Sequence[int],
                      with_faithfulness: bool = False) -> dict[str, float]:
    """What the benchmark reports for one query: answer em/f1 of the reader on the selected
    contexts, supporting-passage F1/precision/recall of the selected set vs the gold passages,
    redundancy (near-duplicate pairs), passages used, and optionally faithfulness."""
    g = rw.answer(pool, selected)
    row: dict[str, float] = {"n_passages": float(len(selected)),
                             "redundancy": redundancy_rate([pool.texts[j] for j in selected])}
    if pool.example.answers:
        em, f1, _, _ = best_em_f1(g.text, pool.example.answers)
        row.update({"answer_em": em, "answer_f1": f1})
    if pool.example.gold_passage_ids:
        f, p, r = set_prf({pool.ids[j] for j in selected}, pool.gold_ids())
        row.update({"support_f1": f, "support_prec": p, "support_recall": r})
    if with_faithfulness:
        row["faithfulness"] = rw.faithfulness(pool, selected)
    sims = pool.emb[list(selected)] @ pool.emb[list(selected)].T if selected else np.zeros((0, 0))
    off = sims[~np.eye(len(selected), dtype=bool)] if len(selected) > 1 else np.zeros(0)
    row["max_pair_cosine"] = float(off.max()) if off.size else 0.0
    return row
