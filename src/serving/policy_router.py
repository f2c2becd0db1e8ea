"""A per-query config policy in the Serve app: one `Policy` deployment picks the config of each
request from the question's features and answers with it.

    serve:
      policy: {dir: runs/policy/hotpotqa, epsilon: 0.1}   # a directory of rl.routing.base.save_policy
      traffic: {mode: policy}

`PolicyRouter` (no Ray) holds the loaded policy (`rl.routing.base.load_policy`: the supervised
router, LinUCB, or any `PerQueryPolicy`) behind ε-uniform exploration (`Exploring`, the ε the
user sets, default the directory's: every arm keeps a propensity >= ε/M) and a
`QueryFeaturizer` over the replica's already-open indexes with the policy's own base
config. With `candidate_dir` and `candidate_share` δ, a
candidate policy awaiting its off-policy gate (same portfolio, same features) is given δ of
the requests on top of the uniform ε (candidate-aware exploration, `rl.routing.base`), so its
own choices are logged with a propensity >= δ and its DR estimate from the log is usable:

    serve:
      policy: {dir: runs/policy/v1, epsilon: 0.1, candidate_dir: runs/policy/v2,
               candidate_share: 0.1}

`pick(question)` computes the features, the arm probabilities, draws an arm and returns a
`PolicyPick`: the arm, its config and hash, the propensity it was drawn with, the features and
their hash, and the pick time in ms.

`PolicyService` is the replica body: the served dataset's indexes opened once, one
`rag.pipeline.Pipeline` per arm sharing them behind `SharedRetrievals` (so the pipeline reuses
the retrievals the features already made for the question; each arm is warmed up at start),
and `answer()`
returning what `serving.pipelines.PipelineService.answer` returns plus `policy` (the pick).
A threshold cascade's directory (`rl.routing.cascade.CascadePolicy`, kind "cascade") is
served in two decisions per request: its cheap arm answers, then the escalation is drawn from
that attempt's signals and the question's features (`PolicyService._answer_cascade`).
The ingress (`serving.routes_policy`) logs the pick's propensity, arm, policy id and features
hash in the interaction log, so a candidate policy can be evaluated off-policy from it
(`rl.promotion.log_evaluators.policy_from_log`).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from ray import serve

from rag.config import RAGConfig
from rag.env import configure_runtime_env
from rag.errors import ConfigError
from rl.routing.base import (
    Exploring,
    LoadedPolicy,
    explore_mix,
    load_policy,
    sample_arms,
)
from rl.routing.cascade import ABSTAIN, CascadePolicy
from rl.routing.features import QueryFeaturizer

POLICY_HANDLE = "__policy__"
"""Key of the policy deployment among the handles the app builder gives the ingress."""
FEATURE_CACHE = 4096
"""Questions whose features the featurizer keeps (it caches per question; cleared when full)."""


@dataclass(frozen=True)
class PolicyPick:
    """One decision: arm index and name, its config (JSON) and hash, the propensity it was
    drawn with (in (0, 1]), the greedy arm, the features (float list) and their 12-hex hash,
    the policy id, and times [ms]: `features_ms` (the featurizer's retrievals and question
    features), `decide_ms` (the policy's probabilities + the draw: the pick itself) and
    `pick_ms` (both); `candidate_id` / `candidate_share`: the candidate policy explored beside
    it and its share ("" / 0.0 without one). `decisions`: a cascade's two decisions, in order
    (`PolicyService.answer`; empty for a one-decision policy)."""

    arm: int
    arm_name: str
    config_hash: str
    config: dict[str, Any]
    propensity: float
    greedy_arm: int
    features: list[float]
    features_hash: str
    policy_id: str
    features_ms: float
    decide_ms: float
    pick_ms: float
    candidate_id: str = ""
    candidate_share: float = 0.0
    decisions: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def features_hash(x: np.ndarray) -> str:
    """12 hex of the float32 bytes of a feature vector (what was decided on, compactly)."""
    return hashlib.sha256(np.asarray(x, dtype=np.float32).tobytes()).hexdigest()[:12]


class PolicyRouter:
    """Picks a config per question (module docstring). Thread-safe (one RNG under a lock)."""

    def __init__(self, loaded: LoadedPolicy, indexes, epsilon: float | None = None,
                 seed: int = 0, candidate: LoadedPolicy | None = None,
                 candidate_share: float = 0.0):
        self.loaded = loaded
        self.candidate = candidate
        eps = loaded.epsilon if epsilon is None else epsilon
        if candidate is not None:
            if CascadePolicy.KIND in (loaded.kind, candidate.kind):
                raise ConfigError("candidate_dir", "a threshold cascade is served without a "
                                                   "candidate policy beside it")
            _same_features(loaded, candidate)
        self.policy = Exploring(loaded.policy, eps, candidate.policy if candidate else None,
                                candidate_share)
        self.arms: list[RAGConfig] = list(loaded.policy.arms)
        try:  # the columns the policy was trained on, formulation views included
            self.featurizer = QueryFeaturizer.for_names(indexes, loaded.base_config,
                                                        loaded.feature_names)
        except ValueError as exc:
            raise ConfigError("policy", f"{loaded.policy_id}: {exc}") from None
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()

    @classmethod
    def open(cls, policy_dir: str, indexes, epsilon: float | None = None, seed: int = 0,
             candidate_dir: str | None = None, candidate_share: float = 0.0) -> PolicyRouter:
        cand = load_policy(candidate_dir) if candidate_dir else None
        return cls(load_policy(policy_dir), indexes, epsilon, seed, cand, candidate_share)

    @property
    def epsilon(self) -> float:
        return self.policy.epsilon

    @property
    def is_cascade(self) -> bool:
        return self.loaded.kind == CascadePolicy.KIND

    def features(self, question: str, history=None) -> np.ndarray:
        """The policy's question features of `question` (N_FEATURES,) float64; the featurizer's
        cache is cleared past `FEATURE_CACHE` questions."""
        from rag.types import Example

        x = self.featurizer.features(Example(id="q", question=question,
                                             history=tuple(history or ())))
        with self._lock:
            if len(self.featurizer._cache) > FEATURE_CACHE:  # bounded memory when serving
                self.featurizer._cache.clear()
        return np.asarray(x, dtype=np.float64)

    def draw(self) -> float:
        """One uniform draw in [0, 1) from the router's seeded generator."""
        with self._lock:
            return float(self._rng.random())

    def pick(self, question: str, history=None) -> PolicyPick:
        """Features of `question` -> arm probabilities -> one sampled arm (module docstring)."""
        t0 = time.perf_counter()
        x = self.features(question, history)
        t1 = time.perf_counter()
        X = x[None, :].astype(np.float64)
        inner = self.loaded.policy.probs(X)  # one prediction: greedy and mixture from it
        share = self.policy.candidate_share
        cand = self.candidate.policy.probs(X) if share > 0.0 else None
        probs = explore_mix(inner, self.policy.epsilon, cand, share)
        greedy = int(np.argmax(inner[0]))
        with self._lock:
            arm, prop = sample_arms(probs, self._rng)
        j = int(arm[0])
        t2 = time.perf_counter()
        cfg = self.arms[j]
        return PolicyPick(j, self.loaded.names[j], cfg.config_hash, cfg.model_dump(mode="json"),
                          float(prop[0]), greedy, [float(v) for v in x], features_hash(x),
                          self.loaded.policy_id, (t1 - t0) * 1000.0, (t2 - t1) * 1000.0,
                          (t2 - t0) * 1000.0,
                          self.candidate.policy_id if self.candidate else "", share)


def _same_features(served: LoadedPolicy, candidate: LoadedPolicy) -> None:
    """ConfigError naming `candidate` unless the candidate decides on the served policy's
    features: the same featurizer base config and feature names (one featurizer computes
    them for both, and the log stores one feature vector per request)."""
    if candidate.base_config.config_hash != served.base_config.config_hash:
        raise ConfigError("candidate", f"the candidate policy {candidate.policy_id} was built "
                                       f"on another featurizer base config than the served "
                                       f"{served.policy_id}")
    if list(candidate.feature_names) != list(served.feature_names):
        raise ConfigError("candidate", f"the candidate policy {candidate.policy_id} uses "
                                       f"other features ({len(candidate.feature_names)}) than "
                                       f"the served {served.policy_id} "
                                       f"({len(served.feature_names)})")


class _CachedSearch:
    """A retriever whose `search` (and `embed_query`) results are kept in a small LRU keyed by
    the call's arguments; everything else is the wrapped retriever's."""

    def __init__(self, inner, size: int):
        self.inner, self.size = inner, size
        self._lru: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def _cached(self, key, compute):
        with self._lock:
            if key in self._lru:
                self._lru.move_to_end(key)
                return self._lru[key]
        got = compute()
        with self._lock:
            self._lru[key] = got
            if len(self._lru) > self.size:
                self._lru.popitem(last=False)
        return got

    def search(self, query: str, top_n: int = 10, **kw: Any):
        key = ("search", query, top_n, tuple(sorted(kw.items())))
        return list(self._cached(key, lambda: self._search(query, top_n, **kw)))

    def _search(self, query: str, top_n: int, **kw: Any):
        from rag.index.base import check_top_n
        from rag.index.dense import DenseRetriever

        inner = self.inner
        if (not kw and isinstance(inner, DenseRetriever)
                and type(inner).search is DenseRetriever.search):
            # DenseRetriever.search, with the query's embedding from the cache: one encoding
            # per question for every top_n the featurizer, the graph's seeds and the arm ask
            check_top_n(top_n)
            return inner.search_vectors(self.embed_query(query)[None, :], top_n)[0]
        return inner.search(query, top_n, **kw)

    def embed_query(self, query: str):
        return self._cached(("embed", query), lambda: self.inner.embed_query(query))

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class SharedRetrievals:
    """An `IndexProvider` over `indexes` whose retrievers remember their last `size` calls,
    shared by the featurizer and the arms' pipelines of one replica: the retrievals the
    policy's features made for a question are not repeated when the chosen config's pipeline
    asks the same retriever the same thing (`rag.index.provider`). A dense retriever encodes a
    question once for every `top_n` asked, and the graph retriever is seeded by these cached
    retrievers, so its seed searches reuse theirs."""

    def __init__(self, indexes, size: int = 256):
        self.inner, self.size = indexes, size
        self.corpus = indexes.corpus
        self.encoder_name = indexes.encoder_name
        self._wrapped: dict[tuple, _CachedSearch] = {}
        self._lock = threading.Lock()

    def _wrap(self, key: tuple, make) -> _CachedSearch:
        with self._lock:
            if key not in self._wrapped:
                self._wrapped[key] = _CachedSearch(make(), self.size)
            return self._wrapped[key]

    def bm25(self, backend: str = "tantivy"):
        return self._wrap(("bm25", backend), lambda: self.inner.bm25(backend))

    def dense(self, kind: str = "flat"):
        return self._wrap(("dense", kind), lambda: self.inner.dense(kind))

    def graph(self, bm25_backend: str | None = None, dense_kind: str = "flat"):
        from rag.index.graph import GraphRetriever

        default = getattr(self.inner, "default_bm25_backend", None)
        backend = bm25_backend or (default() if default else None)
        if backend is None:  # a provider that picks its own: its graph as it is
            return self._wrap(("graph", None, dense_kind),
                              lambda: self.inner.graph(None, dense_kind))
        # seeded by this object's cached bm25 and dense retrievers (made here, before `_wrap`
        # takes its lock: it is not re-entrant), so the graph's seed searches reuse theirs
        seeds = [self.bm25(backend), self.dense(dense_kind)]

        def make():
            g = self.inner.graph(backend, dense_kind)
            # another engine's graph: as it is
            return g.with_seeds(seeds) if isinstance(g, GraphRetriever) else g

        return self._wrap(("graph", backend, dense_kind), make)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class PolicyService:
    """The policy deployment's replica body, usable without Ray (module docstring)."""

    def __init__(self, policy_dir: str, dataset: str | None = None,
                 index_dir: str | None = None,
                 epsilon: float | None = None, seed: int = 0, warmup: bool = True,
                 indexes: dict[str, Any] | None = None, candidate_dir: str | None = None,
                 candidate_share: float = 0.0):
        configure_runtime_env()
        from rag.pipeline import Pipeline
        from serving.pipelines import WARMUP_QUESTION, open_served_data, warm_up

        index_set, self.gold = open_served_data(dataset, index_dir, indexes)
        index_set = SharedRetrievals(index_set)
        self.router = PolicyRouter.open(policy_dir, index_set, epsilon, seed, candidate_dir,
                                        candidate_share)
        self.pipelines = [Pipeline(index_set, c) for c in self.router.arms]
        self.answer_signals = None  # the cascade's reference-free signals of its cheap answer
        if self.router.is_cascade and self.router.loaded.policy.answer_signals:
            from rag.metrics.signals import AnswerSignals

            self.answer_signals = AnswerSignals()
        if warmup:
            for p in self.pipelines:
                warm_up(p)  # loads models, builds any missing index
            if self.router.is_cascade:
                self.answer(WARMUP_QUESTION)
            else:
                self.router.pick(WARMUP_QUESTION)

    def answer(self, question: str, query_id: str = "q", history=None) -> dict[str, Any]:
        """Pick a config (from the question and `history`, the conversation's earlier turns),
        answer with it: `PipelineService.answer`'s dict plus `policy` (`PolicyPick.to_dict()`)
        and `latency_ms.policy_pick`."""
        from serving.pipelines import add_scores, answer_fields

        if self.router.is_cascade:
            return self._answer_cascade(question, query_id, history)
        pick = self.router.pick(question, history)
        cfg = self.router.arms[pick.arm]
        ans = self.pipelines[pick.arm].run(question, query_id, history=history or None)
        out = answer_fields(ans, policy=pick.to_dict())
        out["latency_ms"].update(policy_features=pick.features_ms, policy_pick=pick.decide_ms)
        return add_scores(out, ans, self.gold, question, cfg.k)

    def _answer_cascade(self, question: str, query_id: str, history) -> dict[str, Any]:
        """`answer` of a threshold cascade (`rl.routing.cascade.CascadePolicy`): the cheap arm
        answers (decision 1, propensity 1); its attempt signals (`signal_rows`, the code the
        cascade was fitted on) beside the question's features give the confidence, and the
        escalation decision is drawn (`CascadePolicy.decide`: greedy below τ, flipped with
        probability ε; decision 2, its propensity). Escalated, the strong arm answers again
        (tokens and stage latencies of both attempts summed) or, when stage 2 abstains, the
        answer becomes `rag.generation.prompts.INSUFFICIENT` (the cheap attempt's tokens).
        `policy` is the final answer's pick: arm 0 (cheap) or 1 (escalated), its propensity
        the product of both decisions', `features` the decision row, `decisions` both."""
        import dataclasses

        from rag.generation.prompts import INSUFFICIENT
        from rl.routing.cascade import signal_rows
        from serving.pipelines import add_scores, answer_fields

        router, pol = self.router, self.router.loaded.policy
        hist = history or None
        t0 = time.perf_counter()
        x = router.features(question, history)
        t1 = time.perf_counter()
        cheap, trace = self.pipelines[0].run_traced(question, query_id, None, hist)
        t2 = time.perf_counter()
        z = np.concatenate([x, signal_rows([question], [cheap], [trace],
                                           self.answer_signals)[0]])
        d = pol.decide(z, router.epsilon, router.draw())
        t3 = time.perf_counter()
        lat = {k: float(v) for k, v in cheap.latency_ms.items()}
        ans, tok_in, tok_out = cheap, int(cheap.tokens_in), int(cheap.tokens_out)
        if d["escalate"] and pol.abstains:
            ans = dataclasses.replace(cheap, text=INSUFFICIENT, citations=())
        elif d["escalate"]:
            ans = self.pipelines[1].run(question, query_id, history=hist)
            tok_in, tok_out = tok_in + int(ans.tokens_in), tok_out + int(ans.tokens_out)
            for k, v in ans.latency_ms.items():
                lat[k] = lat.get(k, 0.0) + float(v)
        lat["policy_features"] = (t1 - t0) * 1000.0
        lat["policy_pick"] = (t3 - t2) * 1000.0  # attempt signals + the decision
        arm = int(d["escalate"])
        name = pol.stage2 if arm else pol.names[0]
        cfg = None if arm and pol.abstains else router.arms[arm]
        decisions = ({"stage": "cheap", "arm": 0, "arm_name": pol.names[0],
                      "propensity": 1.0},
                     {"stage": "escalate", **d, "to": pol.stage2})
        pick = PolicyPick(arm, name, cfg.config_hash if cfg else ABSTAIN,
                          cfg.model_dump(mode="json") if cfg else {}, d["propensity"],
                          int(d["greedy_escalate"]), [float(v) for v in z], features_hash(z),
                          router.loaded.policy_id, lat["policy_features"], lat["policy_pick"],
                          lat["policy_features"] + lat["policy_pick"], decisions=decisions)
        out = answer_fields(ans, latency_ms=lat, tokens_in=tok_in, tokens_out=tok_out,
                            variant_id=pick.config_hash, policy=pick.to_dict())
        return add_scores(out, ans, self.gold, question, (cfg or router.arms[0]).k)

    def signals(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The reference-free signals of an answer this deployment gave
        (`serving.pipelines.score_signals` of its record's `signal_input`)."""
        from serving.pipelines import score_signals

        return score_signals(payload)

    def info(self) -> dict[str, Any]:
        lp, cand = self.router.loaded, self.router.candidate
        return {"variant_id": POLICY_HANDLE, "policy_id": lp.policy_id, "kind": lp.kind,
                "arms": lp.names, "epsilon": self.router.epsilon, "pid": os.getpid(),
                "gold_questions": len(self.gold),
                "candidate_id": cand.policy_id if cand else None,
                "candidate_share": self.router.policy.candidate_share}


@serve.deployment(name="Policy")
class PolicyDeployment(PolicyService):
    """Serve deployment of the per-query policy (one per app)."""


def bind_policy(s, options: dict[str, Any]):
    """The bound policy deployment of ServeSettings `s` (`s.policy` set), with the pipelines'
    deployment `options`."""
    p = s.policy
    extra = {"indexes": s.indexes} if s.indexes is not None else {}
    return PolicyDeployment.options(name="Policy", **options).bind(
        p.dir, s.dataset, s.index_dir, p.epsilon, p.seed, candidate_dir=p.candidate_dir,
        candidate_share=p.candidate_share, **extra)
