"""The drift benchmark's streams, systems and regret bookkeeping (`bench/drift.py` runs them).

No data loading and no model weights here: everything works on matrices, so the unit tests
(`tests/unit/test_drift_streams.py`) plant a world and check the bookkeeping.

Vocabulary.
  * A *pool* holds the test-split queries a phase may draw from: `R` (n, K) per-query reward
    of each of the K portfolio configs ("arms", reward units), `X` (n, d) the query features
    (`rl.routing.features`, no gold) and `labels` (n,) the group a query belongs to (HotpotQA
    type, MTRAG domain or turn band, ...). A price change is a second pool over the same
    queries whose `R` is recomputed with the new token price; a corpus update one over the
    queries of the regenerated world.
  * A *phase* (`PhaseSpec`) draws `length` queries from one pool with fixed group shares
    (`draw_phase`: exact counts by largest remainder, queries drawn with replacement within a
    group, then shuffled); a *stream* (`StreamSpec`) is a sequence of phases. `realise` turns
    a stream and a seed into the (N, K) reward matrix, (N, d) features and the phase of every
    step that all systems then face.
  * A *system* returns the arm it served at every step (N,). Its per-query regret at step t
    is R[t, b_p] − R[t, a_t], with b_p the best static arm of t's phase in hindsight (the arm
    with the highest mean reward over that phase's drawn queries): `regret`.
  * A system that acts outside the portfolio (the per-query PPO policy picks any config of
    the space) brings its own per-query rewards: a pool's `extra[name]` is (n, S), the reward
    of its S trained copies (one per seed) on each query, carried through `realise`; its
    regret is R[t, b_p] − its reward at t (`regret_of_served`).

Systems (names as they appear in the rows):
  * `frozen-static`: one arm for the whole stream, the best on the valid split weighted by
    the phase-1 mix (`static_arm_for_mix`); never changes.
  * `searcher-per-phase`: serves that arm in phase 1 (it was tuned offline on valid); at each
    shift (it is told when the phase changes, which favours it) it re-runs successive halving
    over the portfolio on the new phase's queries: rung sizes `SH_RUNGS` queries per arm,
    keeping the best 1/`SH_ETA` by mean reward after each rung. Every query of the search
    window is served by the candidate being evaluated, so its evaluations are charged as
    regret; after the window it serves the winner.
  * `sw-bandit`: a sliding-window UCB over the portfolio (`rl.routing.portfolio_bandit.SlidingWindowUCB`;
    bandit feedback only: it sees the reward of the arm it served), rewards rescaled to [0, 1]
    by the train split's range.
  * `router-policy`: the learned per-query policy (`act(X)`), frozen.
  * `router-policy-online`: the same policy updated online from bandit feedback
    (`online_policy`): ε-greedy serving logs (features, arm, reward, propensity); a per-arm
    correction of the policy's predicted rewards is refit after every query on the last
    `window` logged steps with clipped importance weights (`OnlineSettings`). What it
    corrects is drift, not the policy's known bias: a logged residual (reward − predicted
    reward) counts only by how far it departs from the residual the policy had on the valid
    split in the same situation (`Calibration`: the arm served greedily, or explored), so in
    a world that did not move the online policy stays the frozen one (up to exploration).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

SH_RUNGS = (1, 3, 10)
"""Queries per surviving arm in each successive-halving rung (30 arms: 30 + 30 + 30)."""
SH_ETA = 3


@dataclass(frozen=True)
class PhaseSpec:
    """`mix`: group label -> share of the phase's queries (shares sum to 1); `pool`: the pool
    drawn from."""

    mix: dict[str, float]
    pool: str = "main"


@dataclass(frozen=True)
class StreamSpec:
    """A named stream over one dataset: phases of `length` queries each."""

    name: str
    dataset: str
    phases: tuple[PhaseSpec, ...]
    length: int
    note: str = ""


@dataclass
class Pool:
    """Test-split queries of one pool (module docstring): R (n, K), X (n, d), labels (n,),
    and `ids` (n,) the query ids (what the leakage test compares)."""

    R: np.ndarray
    X: np.ndarray
    labels: np.ndarray
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    """System name -> (n, S) per-query rewards of a system outside the arms (S copies)."""


@dataclass
class Realised:
    """One seed's stream: rewards R (N, K), features X (N, d), phase (N,) ints, per phase
    the pool and the drawn query indices, and the pools' `extra` systems' rewards (N, S)."""

    R: np.ndarray
    X: np.ndarray
    phase: np.ndarray
    draws: list[tuple[str, np.ndarray]]
    extra: dict[str, np.ndarray] = field(default_factory=dict)


def phase_counts(mix: dict[str, float], length: int) -> dict[str, int]:
    """Exact query counts per group summing to `length` (largest remainder of length·share)."""
    total = sum(mix.values())
    if not mix or total <= 0 or any(v < 0 for v in mix.values()):
        raise ValueError(f"a phase mix needs non-negative shares with a positive sum: {mix}")
    raw = {g: length * v / total for g, v in mix.items()}
    counts = {g: int(math.floor(x)) for g, x in raw.items()}
    rest = length - sum(counts.values())
    for g in sorted(raw, key=lambda g: -(raw[g] - counts[g]))[:rest]:
        counts[g] += 1
    return counts


def draw_phase(labels: np.ndarray, mix: dict[str, float], length: int,
               rng: np.random.Generator) -> np.ndarray:
    """Indices into a pool: `phase_counts` queries per group, drawn with replacement within
    the group (a phase may be longer than a group is large), in shuffled order."""
    labels = np.asarray(labels)
    out = []
    for g, c in phase_counts(mix, length).items():
        members = np.flatnonzero(labels == g)
        if c and members.size == 0:
            raise ValueError(f"group {g!r} has no queries in the pool")
        out.append(rng.choice(members, size=c, replace=True))
    idx = np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
    return idx[rng.permutation(idx.size)]


def realise(spec: StreamSpec, pools: dict[str, Pool], seed: int) -> Realised:
    """The stream of `spec` for `seed` (module docstring)."""
    rng = np.random.default_rng(seed)
    used = [pools[phase.pool] for phase in spec.phases]
    names = set().union(*(p.extra for p in used))
    missing = sorted(n for n in names if any(n not in p.extra for p in used))
    if missing:
        raise ValueError(f"stream {spec.name}: systems {missing} have rewards in some of its "
                         "pools but not in all")
    Rs, Xs, ph, draws = [], [], [], []
    extra: dict[str, list[np.ndarray]] = {n: [] for n in sorted(names)}
    for p, phase in enumerate(spec.phases):
        pool = pools[phase.pool]
        idx = draw_phase(pool.labels, phase.mix, spec.length, rng)
        Rs.append(pool.R[idx])
        Xs.append(pool.X[idx])
        ph.append(np.full(idx.size, p))
        draws.append((phase.pool, idx))
        for n in extra:
            extra[n].append(pool.extra[n][idx])
    return Realised(np.vstack(Rs), np.vstack(Xs), np.concatenate(ph), draws,
                    {n: np.vstack(v) for n, v in extra.items()})


def static_arm_for_mix(R_valid: np.ndarray, labels_valid: Sequence, mix: dict[str, float]
                       ) -> int:
    """The arm with the best valid reward under `mix`: Σ_g share_g · mean of group g's valid
    queries (a group absent from valid is left out and the shares renormalised)."""
    labels = np.asarray(labels_valid)
    score, wsum = np.zeros(R_valid.shape[1]), 0.0
    for g, w in mix.items():
        m = labels == g
        if w > 0 and m.any():
            score += w * R_valid[m].mean(axis=0)
            wsum += w
    if wsum == 0:
        raise ValueError(f"no valid query belongs to the mix {mix}")
    return int(np.argmax(score))


# ---- regret -------------------------------------------------------------------------------
def phase_best(R: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """Best static arm of each phase in hindsight (highest mean over its steps), (P,)."""
    return np.array([int(np.argmax(R[phase == p].mean(axis=0)))
                     for p in range(int(phase.max()) + 1)])


def regret(R: np.ndarray, phase: np.ndarray, choices: np.ndarray) -> np.ndarray:
    """Per-step regret against the phase's best static arm in hindsight, (N,) reward units
    (negative where the system beat that arm on the query)."""
    best = phase_best(R, phase)
    t = np.arange(R.shape[0])
    return R[t, best[phase]] - R[t, np.asarray(choices, dtype=np.int64)]


def regret_of_served(R: np.ndarray, phase: np.ndarray, served: np.ndarray) -> np.ndarray:
    """Per-step regret of a system that reports the reward it got (N,) instead of an arm:
    R[t, b_p] − served[t] (a system outside the portfolio, module docstring)."""
    best = phase_best(R, phase)
    return R[np.arange(R.shape[0]), best[phase]] - np.asarray(served, dtype=np.float64)


# ---- systems ------------------------------------------------------------------------------
def frozen_static(n_steps: int, arm: int) -> np.ndarray:
    return np.full(n_steps, int(arm), dtype=np.int64)


def searcher_per_phase(R: np.ndarray, phase: np.ndarray, start_arm: int,
                       rng: np.random.Generator, rungs: Sequence[int] = SH_RUNGS,
                       eta: int = SH_ETA) -> np.ndarray:
    """Successive halving re-run at every phase start after the first (module docstring).
    Reads R[t, a] only for the arm a it serves at step t (what an online evaluation sees)."""
    n, k = R.shape
    out = np.empty(n, dtype=np.int64)
    current = int(start_arm)
    t = 0
    while t < n:
        p = phase[t]
        end = t + int(np.sum(phase[t:] == p))  # phases are contiguous
        if p > 0:
            sums, cnts = np.zeros(k), np.zeros(k)
            alive = list(rng.permutation(k))
            for r, m in enumerate(rungs):
                for a in alive:
                    for _ in range(m):
                        if t >= end:
                            break
                        out[t] = a
                        sums[a] += R[t, a]
                        cnts[a] += 1
                        t += 1
                if t >= end:
                    break
                means = np.where(cnts > 0, sums / np.maximum(cnts, 1), -np.inf)
                keep = max(1, math.ceil(len(alive) / eta)) if r < len(rungs) - 1 else 1
                alive = sorted(alive, key=lambda a: -means[a])[:keep]
            means = np.where(cnts > 0, sums / np.maximum(cnts, 1), -np.inf)
            current = int(alive[0]) if t < end else int(np.argmax(means))
        out[t:end] = current
        t = end
    return out


def run_bandit(R: np.ndarray, bandit, lo: float, hi: float) -> np.ndarray:
    """Serve every step with `bandit.select()` and feed back the served arm's reward rescaled
    to [0, 1] by (lo, hi) (clipped): bandit feedback only."""
    out = np.empty(R.shape[0], dtype=np.int64)
    span = max(hi - lo, 1e-9)
    for t in range(R.shape[0]):
        a = int(bandit.select())
        out[t] = a
        bandit.update(a, float(np.clip((R[t, a] - lo) / span, 0.0, 1.0)))
    return out


@dataclass(frozen=True)
class OnlineSettings:
    """`router-policy-online`: explore uniformly with probability `epsilon`; the correction of
    arm j is Σ w·(r − f_j(x)) / (Σ w + `prior`) over the last `window` logged steps that
    served j, with importance weights w = min(1/propensity, `max_weight`)."""

    epsilon: float = 0.05
    window: int = 150
    prior: float = 5.0
    max_weight: float = 20.0


@dataclass(frozen=True)
class Calibration:
    """The policy's mean residual (reward − predicted reward) per arm on the valid split:
    `greedy` (K,) over the queries where the policy picks that arm (an arm it never picks:
    its mean over all queries), `explored` (K,) over all queries."""

    greedy: np.ndarray
    explored: np.ndarray

    @classmethod
    def none(cls, k: int) -> Calibration:
        return cls(np.zeros(k), np.zeros(k))

    @classmethod
    def from_valid(cls, R: np.ndarray, scores: np.ndarray, choice: np.ndarray) -> Calibration:
        resid = R - scores
        explored = resid.mean(axis=0)
        greedy = np.array([resid[choice == j, j].mean() if np.any(choice == j)
                           else explored[j] for j in range(R.shape[1])])
        return cls(greedy, explored)


ONLINE_GRID = tuple(OnlineSettings(epsilon=e, max_weight=w, prior=p, window=n)
                    for e in (0.02, 0.05) for w in (1.0, 5.0, 20.0) for p in (5.0, 20.0)
                    for n in (150, 300))
"""What `bench/drift.py` chooses `router-policy-online`'s settings from, on valid-split streams
(a weight cap of 1 is plain residual means: no importance weighting)."""


def online_policy(R: np.ndarray, scores: np.ndarray, rng: np.random.Generator,
                  s: OnlineSettings = OnlineSettings(), calib: Calibration | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The learned policy updated online (module docstring). `scores` (N, K): the frozen
    policy's predicted reward of every arm per step (its argmax is the frozen choice);
    `calib`: its valid-split residuals (None: zero). Reads R[t, a] only for the served arm.
    Returns (arms (N,), propensities (N,))."""
    n, k = R.shape
    calib = calib or Calibration.none(k)
    arms, props = np.empty(n, dtype=np.int64), np.empty(n)
    wsum, rsum = np.zeros(k), np.zeros(k)
    log: deque[tuple[int, float, float]] = deque()
    for t in range(n):
        corr = rsum / (wsum + s.prior)
        greedy = int(np.argmax(scores[t] + corr))
        explore = rng.random() < s.epsilon
        a = int(rng.integers(k)) if explore else greedy
        p = s.epsilon / k + (1.0 - s.epsilon) * (a == greedy)
        arms[t], props[t] = a, p
        w = min(1.0 / p, s.max_weight)
        expected = calib.greedy[a] if a == greedy else calib.explored[a]
        resid = R[t, a] - scores[t, a] - expected
        log.append((a, w, resid))
        wsum[a] += w
        rsum[a] += w * resid
        if len(log) > s.window:
            a0, w0, r0 = log.popleft()
            wsum[a0] -= w0
            rsum[a0] -= w0 * r0
    return arms, props


def run_systems(real: Realised, static_arm: int, policy_act: Callable[[np.ndarray], np.ndarray],
                policy_scores: Callable[[np.ndarray], np.ndarray], make_bandit: Callable,
                reward_range: tuple[float, float], seed: int,
                online: OnlineSettings = OnlineSettings(), calib: Calibration | None = None
                ) -> dict[str, np.ndarray]:
    """Every system's served arms on one realised stream (system name -> (N,) ints)."""
    R, n = real.R, real.R.shape[0]
    rng = np.random.default_rng([seed, 1])
    return {
        "frozen-static": frozen_static(n, static_arm),
        "searcher-per-phase": searcher_per_phase(R, real.phase, static_arm, rng),
        "sw-bandit": run_bandit(R, make_bandit(R.shape[1], seed), *reward_range),
        "router-policy": np.asarray(policy_act(real.X), dtype=np.int64),
        "router-policy-online": online_policy(R, policy_scores(real.X),
                                           np.random.default_rng([seed, 2]), online,
                                           calib)[0],
    }


SYSTEMS = ("frozen-static", "searcher-per-phase", "sw-bandit", "router-policy",
           "router-policy-online")
