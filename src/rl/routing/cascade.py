"""A policy that observes before it spends: a two-stage cascade with a calibrated confidence
threshold (the supervised counterpart of a multi-step PPO cascade).

Stage 1 answers every question with a cheap config. What that attempt produced is then
observed — signals that exist only after it ran (`attempt_signals`, columns `SIGNAL_NAMES`):

    abstained           1 when the answer abstains (`rag.metrics.claims.is_noncommittal`)
    log_answer_words    log(1 + words of the answer)
    n_citations         passages the answer cites
    type_fit            1 when the answer's type fits the question's (`rag.generation.answer_check`)
    attempt_s1          score of the attempt's top ranked hit [the stage's own score scale]
    attempt_gap12       its margin over the second hit (0 with fewer than two)
    attempt_ctx_gap     top hit's score minus the last context's (how flat the context is)
    sig_relevancy, sig_faithfulness, sig_combined
                        the reference-free answer signals of the cheap answer
                        (`rag.metrics.signals.AnswerSignals`; with `answer_signals` only)

and, beside the question's own features (`rl.routing.features.QueryFeaturizer`: retrieval
scores and BM25/dense/graph top-k agreement), they feed a logistic calibration of
P(cheap answer is as good as the strong one) = P(Q_cheap >= Q_strong − `TIE`), fitted on the
train queries (`fit_calibrator`). A question whose confidence is below τ escalates to stage 2:
the strong config answers it again (both attempts are paid for: `outcomes`), or, when stage 2
is `ABSTAIN` (`with_abstention`), the cheap answer is replaced by an abstention at no further
cost.

τ is chosen on valid (`choose_tau`): with a token budget (equal cost: the best static config's
mean tokens on valid) the τ of the highest mean quality on valid whose mean tokens stay within
it; without one the τ of the highest mean reward on valid. `select_cascade` chooses the (cheap, strong) pair the
same way among the candidate arms, every choice made on train and valid only; the test split
is only scored.

    cas = select_cascade(M, Z, names, budget=None)      # M[role]: R, Q, T (queries × arms)
    esc = cas.escalate(Z_test)                          # bool per question
    got = outcomes(M["test"], cas.cheap, cas.strong, esc)   # {"R", "Q", "T"} per question

Served: `ragpilot router train --learner cascade` (`rl.routing.train.train_cascade_policy`)
chooses it at equal cost and saves a `CascadePolicy` with `rl.routing.base.save_policy`; the
Serve app's `serving.policy_router.PolicyService` answers with the cheap arm, computes that one
answer's signals with `signal_rows` (the code `attempt_signals` runs on a batch) and draws the
escalation with `CascadePolicy.decide` (ε-flipped, its propensity logged).

Units: Q in [0, 1] (αF + βR), R the tuner's per-query reward, T tokens per query. Errors:
`ConfigError` naming the argument (mismatched shapes, no candidate arm, a budget no cascade
can meet).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag.config import RAGConfig
from rag.errors import ConfigError
from rag.generation.answer_check import answer_type, expected_type, fits
from rag.metrics.claims import is_noncommittal
from rag.types import Example

if TYPE_CHECKING:
    from rl.kernel.evaluator import TunerEvaluator

BASE_SIGNALS = ("abstained", "log_answer_words", "n_citations", "type_fit", "attempt_s1",
                "attempt_gap12", "attempt_ctx_gap")
ANSWER_SIGNALS = ("sig_relevancy", "sig_faithfulness", "sig_combined")
SIGNAL_NAMES = BASE_SIGNALS + ANSWER_SIGNALS
"""Columns of `attempt_signals` with answer signals; without them the first seven."""
TIE = 0.01
"""The cheap answer counts as good as the strong one when its quality is within this of it."""
ABSTAIN = "abstain"
"""The stage-2 action that abstains instead of answering (`with_abstention`)."""
CHEAP_CANDIDATES = 3
"""Cheap arms `select_cascade` tries (each needs its own attempt signals)."""


def signal_names(with_answer_signals: bool) -> tuple[str, ...]:
    return SIGNAL_NAMES if with_answer_signals else BASE_SIGNALS


def attempt_signals(indexes: Any, config: RAGConfig, examples: Sequence[Example],
                    resources: Any = None, answer_signals: Any = None,
                    progress: Any = None) -> np.ndarray:
    """(len(examples), len(signal_names(answer_signals is not None))) float64: the signals of
    `config`'s attempt at each example (module docstring), answered by
    `rag.pipeline.Pipeline(indexes, config, resources)` — over the tuner's memoised indexes
    (`rl.common.memo.MemoIndexSet`) the retrievals are cached lookups. `answer_signals`: an
    `AnswerSignals` to add its three scores (encodes answers and context sentences with the
    bi-encoder), None to leave them out. `progress(n_done)` after every 50 examples."""
    from rag.pipeline import Pipeline

    pipe = Pipeline(indexes, config, resources)
    pipe.load_models()
    answers, traces = [], []
    for i, e in enumerate(examples, 1):
        ans, trace = pipe.run_traced(e.question, e.id, None, e.history)
        answers.append(ans)
        traces.append(trace)
        if progress and i % 50 == 0:
            progress(i)
    return signal_rows([e.question for e in examples], answers, traces, answer_signals)


def signal_rows(questions: Sequence[str], answers: Sequence[Any], traces: Sequence[Any],
                answer_signals: Any = None) -> np.ndarray:
    """The attempt signals (module docstring) of answers already given: `answers[i]`
    (`rag.types.Answer`) with its `rag.pipeline.StageTrace` `traces[i]` answered
    `questions[i]`. One implementation for the batched `attempt_signals` and a served
    request (`CascadePolicy.decide` on one row). Shape and `answer_signals` as
    `attempt_signals`."""
    rows = []
    for q, ans, trace in zip(questions, answers, traces, strict=True):
        s = [h.score for h in trace.ranked]
        s1 = s[0] if s else 0.0
        last = next((h.score for h in reversed(trace.ranked) if h.id == ans.contexts[-1].id),
                    s1) if ans.contexts else s1
        text = ans.text.strip()
        rows.append([float(is_noncommittal(text)), math.log1p(len(text.split())),
                     float(len(ans.citations)),
                     float(bool(text) and fits(expected_type(q), answer_type(text))),
                     s1, s1 - s[1] if len(s) > 1 else 0.0, s1 - last])
    n = len(rows)
    out = np.array(rows, dtype=np.float64).reshape(n, len(BASE_SIGNALS))
    if answer_signals is not None:
        sig = answer_signals.score_batch(list(answers))
        out = np.hstack([out, np.array([[d[k] for k in ANSWER_SIGNALS] for d in sig],
                                       dtype=np.float64).reshape(n, 3)])
    return out


def attempts_version(with_answer_signals: bool) -> str:
    """The key under which `role_features` stores attempt signals: the evaluator's
    `rows_version` (the pipeline, generation and metric code, with the answer signals' code)
    and a fingerprint of `attempt_signals` and `signal_rows`. Edited code misses the store
    instead of reusing stale signals."""
    import inspect

    from rl.common.fingerprint import code_fingerprint
    from rl.kernel.evaluator import rows_version

    fp = code_fingerprint((), extra=[inspect.getsource(attempt_signals),
                                     inspect.getsource(signal_rows)])
    return f"attempts-{fp}+{rows_version(True)}:{len(signal_names(with_answer_signals))}"


class AttemptStore:
    """Attempt signals per (config, query id) on disk beside the evaluator's rows
    (`<evaluator root>/attempts-<corpus fingerprint>.sqlite`, keyed by `attempts_version`,
    dataset and config hash): a second run over the same questions reads them instead of
    answering again."""

    def __init__(self, ev: TunerEvaluator, with_answer_signals: bool):
        import sqlite3

        fp = ev.data.indexes.corpus.fingerprint()
        self.prefix = f"{attempts_version(with_answer_signals)}:{ev.data.name}"
        self.db = sqlite3.connect(str(Path(ev.root) / f"attempts-{fp}.sqlite"), timeout=60.0)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS attempts (cfg TEXT, qid TEXT, value TEXT, "
                        "PRIMARY KEY (cfg, qid))")

    def get(self, config: RAGConfig) -> dict[str, list[float]]:
        """query id -> stored signal vector of `config`."""
        got = self.db.execute("SELECT qid, value FROM attempts WHERE cfg=?",
                              (f"{self.prefix}:{config.config_hash}",)).fetchall()
        return {q: json.loads(v) for q, v in got}

    def put(self, config: RAGConfig, qids: Sequence[str], S: np.ndarray) -> None:
        key = f"{self.prefix}:{config.config_hash}"
        self.db.executemany("INSERT OR REPLACE INTO attempts VALUES (?, ?, ?)",
                            [(key, q, json.dumps([float(x) for x in row]))
                             for q, row in zip(qids, S, strict=True)])
        self.db.commit()


def role_features(prep: Any, cheap: int, answer_signals: Any = None, log: Any = None
                  ) -> dict[str, np.ndarray]:
    """role -> (queries, d) features of the cascade with stage-1 arm `cheap`: each role's
    query features `prep.X[role]` beside the signals of that arm's attempt at its questions
    (`attempt_signals` over the evaluator's memoised indexes; questions an earlier run
    answered are read from the `AttemptStore`). `prep`: an `rl.routing.train.Prepared`; `log`:
    a progress line every 50 questions answered, None for silence."""
    cfg = prep.configs[cheap]
    store = AttemptStore(prep.ev, answer_signals is not None)
    have = store.get(cfg)
    out = {}
    for role, (split, idx) in prep.parts.items():
        ex = [prep.ev.data.examples(split)[int(i)] for i in idx]
        todo = [e for e in ex if e.id not in have]
        if todo:
            say = f"  attempt {prep.names[cheap]} {role}: {{}}/{len(todo)}"
            S = attempt_signals(prep.ev.memo, cfg, todo, prep.ev.resources, answer_signals,
                                (lambda n, s=say: log(s.format(n))) if log else None)
            store.put(cfg, [e.id for e in todo], S)
            have.update({e.id: list(row) for e, row in zip(todo, S, strict=True)})
        S = np.array([have[e.id] for e in ex], dtype=np.float64).reshape(len(ex), -1)
        out[role] = np.hstack([prep.X[role], S])
    return out


def cascade_inputs(prep: Any, budget: float | None, log: Any = None
                   ) -> tuple[dict[str, dict[str, np.ndarray]], list[str],
                              dict[int, dict[str, np.ndarray]]]:
    """What a cascade is chosen from, for rows prepared by `rl.routing.train.prepare`: the
    decision rows (question features + attempt signals, with the reference-free answer
    signals) of every cheap candidate (`cheap_candidates` within `budget` mean tokens on
    valid; None: unbounded) over every role (`role_features`), and the role matrices with the
    `ABSTAIN` column (`with_abstention`). Returns (M, column names, Z: cheap arm -> role ->
    rows). `log(line)` after each candidate's attempts."""
    import time

    from rag.metrics.signals import AnswerSignals

    sig, t0 = AnswerSignals(), time.perf_counter()
    Z: dict[int, dict[str, np.ndarray]] = {}
    for cheap in cheap_candidates(prep.M["valid"], budget):
        Z[cheap] = role_features(prep, cheap, sig, log)
        if log:
            log(f"  cascade: attempts of `{prep.names[cheap]}` "
                f"({time.perf_counter() - t0:.0f} s)")
    M, names = with_abstention(prep.ev, prep.configs[0], prep.M, prep.parts, prep.names)
    return M, names, Z


def with_abstention(ev: TunerEvaluator, config: RAGConfig, M: dict[str, dict[str, np.ndarray]],
                    parts: dict[str, tuple[str, np.ndarray]], names: Sequence[str]
                    ) -> tuple[dict[str, dict[str, np.ndarray]], list[str]]:
    """`M` (role -> R, Q, T: queries × arms) and `names` with one more column, `ABSTAIN`: per
    query the quality of an abstention as the evaluator `ev` scores it (`ev.quality` with the
    row marked abstained: 1 where the gold marks the question unanswerable, else 0; read from
    `config`'s rows of each role's (split, indices) in `parts`), R = Q and T = 0 (an abstention
    spends nothing after the attempt: `outcomes` charges the cheap attempt's cost)."""
    from rl.kernel.evaluator import ABSTAINED

    spec = ev.reward_spec()
    out = {}
    for role, (split, idx) in parts.items():
        tab = dict(ev.table(config, split, idx))
        tab[ABSTAINED] = np.ones_like(tab["tokens"])
        F, R = ev.quality(tab)
        q = np.asarray(spec.quality(F, R), dtype=np.float64)[np.asarray(idx)]
        out[role] = {"R": np.column_stack([M[role]["R"], q]),
                     "Q": np.column_stack([M[role]["Q"], q]),
                     "T": np.column_stack([M[role]["T"], np.zeros_like(q)])}
    return out, [*names, ABSTAIN]


@dataclass
class Calibrator:
    """Logistic regression of P(cheap is as good as strong) on standardised features; a
    constant when train holds one class only."""

    mean: np.ndarray
    scale: np.ndarray
    model: Any
    constant: float | None = None

    def predict(self, Z: np.ndarray) -> np.ndarray:
        """(n,) probabilities in [0, 1] for the rows of `Z` (n, d)."""
        Z = np.atleast_2d(np.asarray(Z, dtype=np.float64))
        if self.constant is not None:
            return np.full(len(Z), self.constant)
        return self.model.predict_proba((Z - self.mean) / self.scale)[:, 1]


def fit_calibrator(Z: np.ndarray, ok: np.ndarray, C: float = 1.0, seed: int = 0) -> Calibrator:
    """The `Calibrator` of labels `ok` (n,) bool — cheap as good as strong — on features
    `Z` (n, d). ConfigError naming `Z` when the lengths differ or n < 2."""
    from sklearn.linear_model import LogisticRegression

    Z = np.asarray(Z, dtype=np.float64)
    y = np.asarray(ok, dtype=bool)
    if Z.ndim != 2 or len(Z) != len(y) or len(y) < 2:
        raise ConfigError("Z", f"needs (n >= 2, d) features for n labels, got {Z.shape} "
                               f"for {len(y)}")
    mean, scale = Z.mean(axis=0), Z.std(axis=0)
    scale = np.where(scale > 1e-12, scale, 1.0)
    if y.all() or not y.any():
        return Calibrator(mean, scale, None, float(y.mean()))
    model = LogisticRegression(C=C, max_iter=2000, random_state=seed)
    model.fit((Z - mean) / scale, y)
    return Calibrator(mean, scale, model)


def outcomes(M: dict[str, np.ndarray], cheap: int, strong: int, escalate: np.ndarray
             ) -> dict[str, np.ndarray]:
    """Per question: reward R, quality Q and tokens T of the cascade that escalates the
    questions in `escalate` (n,) bool from arm `cheap` to arm `strong` of the matrices `M`
    (R, Q, T: queries × arms). An escalated question gets the strong answer's quality and pays
    both attempts: T = T_cheap + T_strong, R = R_strong − (Q_cheap − R_cheap) (the cheap
    attempt's cost in reward units added to the strong one's)."""
    esc = np.asarray(escalate, dtype=bool)
    R, Q, T = (np.asarray(M[k], dtype=np.float64) for k in ("R", "Q", "T"))
    if esc.shape != (len(Q),):
        raise ConfigError("escalate", f"needs one flag per question ({len(Q)}), got {esc.shape}")
    rc, qc, tc = R[:, cheap], Q[:, cheap], T[:, cheap]
    return {"R": np.where(esc, R[:, strong] - (qc - rc), rc),
            "Q": np.where(esc, Q[:, strong], qc),
            "T": np.where(esc, tc + T[:, strong], tc)}


def choose_tau(p: np.ndarray, M: dict[str, np.ndarray], cheap: int, strong: int,
               budget: float | None = None) -> tuple[float, dict[str, float]] | None:
    """τ on the queries of `M` (valid) with confidences `p`: escalation is p < τ. With
    `budget` (mean tokens), the τ of the highest mean quality among those whose mean tokens
    stay <= budget (None when even τ = 0, no escalation, exceeds it); escalating to a
    stronger arm that is the largest such τ, escalating to an abstention not necessarily.
    Without a budget, the τ of the highest mean reward. Ties go to the smallest τ. Returns
    (τ, {"reward", "quality", "tokens", "escalated"} means at τ)."""
    p = np.asarray(p, dtype=np.float64)
    taus = np.concatenate([[0.0], np.unique(p) + 1e-12])
    best = None
    for tau in taus:
        got = outcomes(M, cheap, strong, p < tau)
        stats = {"reward": float(got["R"].mean()), "quality": float(got["Q"].mean()),
                 "tokens": float(got["T"].mean()), "escalated": float((p < tau).mean())}
        if budget is not None and stats["tokens"] > budget + 1e-9:
            continue
        key = "reward" if budget is None else "quality"
        if best is None or stats[key] > best[1][key] + 1e-12:
            best = (float(tau), stats)
    return best


@dataclass
class ThresholdCascade:
    """A fitted two-stage cascade: arm indices `cheap` and `strong`, their names, the
    `calibrator` over [query features, attempt signals] and the threshold `tau`; `valid`
    holds its means on valid at τ (`choose_tau`)."""

    cheap: int
    strong: int
    names: tuple[str, str]
    calibrator: Calibrator
    tau: float
    valid: dict[str, float]

    def confidence(self, Z: np.ndarray) -> np.ndarray:
        """P(cheap answer is as good as the strong one) per row of `Z`."""
        return self.calibrator.predict(Z)

    def escalate(self, Z: np.ndarray, tau: float | None = None) -> np.ndarray:
        """(n,) bool: questions whose confidence is below τ (`tau`, default the fitted one)."""
        return self.confidence(Z) < (self.tau if tau is None else tau)


def select_cascade(M: dict[str, dict[str, np.ndarray]], Z: dict[int, dict[str, np.ndarray]],
                   names: Sequence[str], budget: float | None = None, seed: int = 0
                   ) -> ThresholdCascade:
    """The cascade best on valid over every (cheap, strong) pair with cheap in `Z` and strong
    any other arm: the calibrator fitted on `M["train"]` with features `Z[cheap]["train"]`, τ
    chosen on valid (`choose_tau` with `budget`), the pair of the highest valid quality within
    the budget (with one) or the highest valid reward (without). `M[role]` for roles train and
    valid: R, Q, T (queries × arms); `Z[cheap][role]`: (queries, d) features of that cheap
    arm's attempt. ConfigError naming `budget` when no pair meets it, `Z` when it is empty."""
    if not Z:
        raise ConfigError("Z", "needs the attempt features of at least one cheap arm")
    key = "quality" if budget is not None else "reward"
    best: ThresholdCascade | None = None
    for cheap, z in Z.items():
        for strong in range(len(names)):
            if strong == cheap:
                continue
            qt = M["train"]["Q"]
            cal = fit_calibrator(z["train"], qt[:, cheap] >= qt[:, strong] - TIE, seed=seed)
            got = choose_tau(cal.predict(z["valid"]), M["valid"], cheap, strong, budget)
            if got is None:
                continue
            if best is None or got[1][key] > best.valid[key] + 1e-12:
                best = ThresholdCascade(cheap, strong, (names[cheap], names[strong]), cal,
                                        got[0], got[1])
    if best is None:
        raise ConfigError("budget", f"no cascade of the cheap arms {[names[c] for c in Z]} "
                                    f"stays within {budget} tokens on valid")
    return best


def cheap_candidates(M_valid: dict[str, np.ndarray], budget: float | None,
                     k: int = CHEAP_CANDIDATES) -> list[int]:
    """The `k` arms to try as stage 1. With `budget`: the arm of the highest valid quality
    among those whose mean valid tokens stay within it (it can still abstain at no cost), then
    the arms of the highest valid quality among those within half of it (room to escalate to a
    stronger arm). Without: the arms of the highest valid reward."""
    Q, R, T = (np.asarray(M_valid[x], dtype=np.float64) for x in ("Q", "R", "T"))
    if budget is None:
        return [int(j) for j in np.argsort(-R.mean(axis=0), kind="stable")[:k]]
    out: list[int] = []
    for room, n in ((1.0, 1), (0.5, k)):
        ok = np.flatnonzero(T.mean(axis=0) <= room * budget + 1e-9)
        order = ok[np.argsort(-Q[:, ok].mean(axis=0), kind="stable")]
        out += [int(j) for j in order if int(j) not in out][:n - len(out)]
    return out


@dataclass
class CascadePolicy:
    """A fitted `ThresholdCascade` as a servable policy (`rl.routing.base.save_policy` with
    kind `KIND`). `arms`: [cheap config] + [strong config], or the cheap config alone when
    stage 2 abstains; `names` their names and `stage2` the name of the escalation's action
    (the strong arm's, or `ABSTAIN`). `feature_names` / `signal_names`: the columns of the
    decision row z = [question features, attempt signals]; `answer_signals` whether the last
    three signals (`ANSWER_SIGNALS`) are among them."""

    cascade: ThresholdCascade
    arms: list[RAGConfig]
    names: list[str]
    stage2: str
    feature_names: list[str]
    signal_names: tuple[str, ...]

    KIND = "cascade"

    @property
    def abstains(self) -> bool:
        return self.stage2 == ABSTAIN

    @property
    def answer_signals(self) -> bool:
        return len(self.signal_names) == len(SIGNAL_NAMES)

    def decide(self, z: np.ndarray, epsilon: float, u: float) -> dict[str, Any]:
        """The escalation decision of one decision row `z` (d,): the greedy one (confidence <
        τ) flipped when the uniform draw `u` in [0, 1) is below `epsilon`, so each branch is
        taken with probability >= min(ε, 1 − ε). Returns {"escalate", "greedy_escalate"
        (bools), "confidence" (P(cheap as good as strong)), "tau", "propensity" (the
        probability the returned decision had: 1 − ε when it is the greedy one, else ε)}.
        ConfigError naming `epsilon` outside [0, 1], `z` of the wrong width."""
        if not 0.0 <= epsilon <= 1.0:
            raise ConfigError("epsilon", f"must be in [0, 1], got {epsilon}")
        z = np.asarray(z, dtype=np.float64).reshape(1, -1)
        width = len(self.feature_names) + len(self.signal_names)
        if z.shape[1] != width:
            raise ConfigError("z", f"needs {width} columns (features + attempt signals), "
                                   f"got {z.shape[1]}")
        conf = float(self.cascade.confidence(z)[0])
        greedy = conf < self.cascade.tau
        flip = u < epsilon
        return {"escalate": bool(greedy ^ flip), "greedy_escalate": bool(greedy),
                "confidence": conf, "tau": float(self.cascade.tau),
                "propensity": float(epsilon if flip else 1.0 - epsilon)}

    def manifest(self) -> dict[str, Any]:
        """The readable record `save_policy` writes under policy.json's `details`: the stages,
        τ, the decision row's column names and the calibrator's coefficients (on standardised
        columns: (z − mean) / scale; `constant` instead when train held one class)."""
        cal = self.cascade.calibrator
        coefs = ({"constant": cal.constant} if cal.constant is not None else
                 {"coef": [float(v) for v in cal.model.coef_[0]],
                  "intercept": float(cal.model.intercept_[0])})
        return {"cheap": self.names[0], "stage2": self.stage2, "tau": float(self.cascade.tau),
                "feature_names": list(self.feature_names),
                "signal_names": list(self.signal_names),
                "calibrator": {"mean": [float(v) for v in cal.mean],
                               "scale": [float(v) for v in cal.scale], **coefs},
                "valid": dict(self.cascade.valid)}


def cascade_policy(cas: ThresholdCascade, configs: Sequence[RAGConfig], names: Sequence[str],
                   feature_names: Sequence[str], with_answer_signals: bool) -> CascadePolicy:
    """The `CascadePolicy` of `cas` chosen among the arms `configs` (named `names`; `cas.strong`
    == len(configs) is the `ABSTAIN` column of `with_abstention`)."""
    abstains = cas.strong >= len(configs)
    arms = [configs[cas.cheap]] + ([] if abstains else [configs[cas.strong]])
    return CascadePolicy(cas, arms, [names[cas.cheap]] + ([] if abstains
                                                         else [names[cas.strong]]),
                         ABSTAIN if abstains else names[cas.strong], list(feature_names),
                         signal_names(with_answer_signals))
