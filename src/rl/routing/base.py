"""What any per-query config policy offers the bench, the OPE code and the Serve app.

A per-query policy chooses one of a fixed list of configs ("arms") per question, from the
question's features (`rl.routing.features.QueryFeaturizer`, shape (n, N_FEATURES)):

    class PerQueryPolicy(Protocol):
        arms: Sequence[RAGConfig]             # the portfolio, arm j = arms[j]
        def probs(X) -> np.ndarray            # (n, len(arms)) action probabilities, rows sum to 1
        def act(X) -> np.ndarray              # (n,) int arm indices: the policy's greedy choice

Implementations: `RouterPolicy` (the supervised router, greedy: one-hot probs) and
`rl.routing.ppo_serving.PPOPortfolioPolicy` (the PPO
policy, which picks configs from the whole space, over a fixed arm list: its greedy picks
on reference queries plus, for a residual policy, its base router's portfolio).
`Exploring(policy, epsilon)` is the ε-mixture every *served* policy
runs behind: probs = (1 − ε)·policy.probs + ε/M, so every arm keeps a propensity of at least
ε/M and the logged propensities make off-policy estimates of any other policy possible. The
user sets ε in [0, 1] (`DEFAULT_EPSILON` when the policy directory or the serve YAML gives
none); ε = 0 serves the policy's own probabilities (a greedy policy logs propensity 1), a log
that supports no off-policy estimate of a policy choosing other arms.

Candidate-aware exploration (`Exploring(policy, epsilon, candidate, candidate_share=δ)`):
probs = (1 − ε − δ)·policy.probs + δ·candidate.probs + ε/M. The uniform floor ε/M stays; the
candidate policy awaiting its off-policy gate gets δ of the traffic on top, so the arms it
would choose are logged with a propensity of at least δ instead of ε/M (1/310 for 31 arms at
ε = 0.1). The importance weights of the candidate's own estimate are then bounded by 1/δ
instead of M/ε, which is what makes its IPS/DR value usable from a log of realistic length.
The exposure is bounded too: the candidate can only choose arms of the same portfolio, every
one of which the uniform ε already serves.

`save_policy(policy, dir)` / `load_policy(dir)`: a policy directory = `policy.json` (kind, arm
configs and names, feature names, base config of the featurizer, the default ε, the learner's
`details`) + `model.pkl` (the pickled policy object). A threshold cascade
(`rl.routing.cascade.CascadePolicy`, kind "cascade") is saved the same way: its arms are its
stages' configs and its `details` hold τ, the calibrator and the decision row's columns. The Serve app loads one with `load_policy`.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rag.config import RAGConfig
from rag.errors import ConfigError

DEFAULT_EPSILON = 0.1
"""Exploration share of a served policy when the user sets none (min propensity ε / M)."""
MAX_CANDIDATE_SHARE = 0.5
"""Share of requests a candidate policy may be given by candidate-aware exploration, at most."""
POLICY_FILE = "policy.json"
MODEL_FILE = "model.pkl"


@runtime_checkable
class PerQueryPolicy(Protocol):
    """See the module docstring."""

    arms: Sequence[RAGConfig]

    def probs(self, X: np.ndarray) -> np.ndarray: ...

    def act(self, X: np.ndarray) -> np.ndarray: ...


def one_hot(choice: np.ndarray, n_arms: int) -> np.ndarray:
    """(n, n_arms) float64 rows with a 1 at each chosen arm."""
    choice = np.asarray(choice, dtype=np.int64)
    out = np.zeros((choice.size, n_arms))
    out[np.arange(choice.size), choice] = 1.0
    return out


def epsilon_mix(probs: np.ndarray, epsilon: float) -> np.ndarray:
    """(1 − ε)·probs + ε/M per row: ε spread uniformly over the M arms."""
    if not 0.0 <= epsilon <= 1.0:
        raise ConfigError("epsilon", f"must be in [0, 1], got {epsilon}")
    p = np.asarray(probs, dtype=np.float64)
    return (1.0 - epsilon) * p + epsilon / p.shape[1]


def explore_mix(probs: np.ndarray, epsilon: float, candidate_probs: np.ndarray | None = None,
                candidate_share: float = 0.0) -> np.ndarray:
    """(1 − ε − δ)·probs + δ·candidate_probs + ε/M per row (module docstring); δ = 0 (the
    default) is `epsilon_mix`."""
    if not 0.0 <= candidate_share <= MAX_CANDIDATE_SHARE:
        raise ConfigError("candidate_share", f"must be in [0, {MAX_CANDIDATE_SHARE}], "
                                             f"got {candidate_share}")
    if candidate_share == 0.0:
        return epsilon_mix(probs, epsilon)
    if candidate_probs is None:
        raise ConfigError("candidate_share", f"{candidate_share} > 0 needs a candidate policy")
    p = np.asarray(probs, dtype=np.float64)
    c = np.asarray(candidate_probs, dtype=np.float64)
    if c.shape != p.shape:
        raise ConfigError("candidate", f"candidate probabilities {c.shape} for a policy's "
                                       f"{p.shape}: the two must share their arms")
    if not 0.0 <= epsilon <= 1.0 - candidate_share:
        raise ConfigError("epsilon", f"epsilon {epsilon} + candidate_share {candidate_share} "
                                     f"must not exceed 1")
    return (1.0 - epsilon - candidate_share) * p + candidate_share * c + epsilon / p.shape[1]


def sample_arms(probs: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One arm per row of `probs` (n, M) by inverse-CDF sampling, and its propensity:
    (arms (n,) int, propensities (n,) float = probs[i, arm_i])."""
    p = np.asarray(probs, dtype=np.float64)
    cdf = np.cumsum(p, axis=1)
    u = rng.random(p.shape[0]) * cdf[:, -1]
    arms = np.minimum((cdf < u[:, None]).sum(axis=1), p.shape[1] - 1)
    return arms, p[np.arange(p.shape[0]), arms]


@dataclass
class RouterPolicy:
    """`rl.routing.router.SupervisedRouter` as a `PerQueryPolicy`: greedy, one-hot probs of
    the router's choice (`router.choose(X)`: argmax of predicted reward − its fitted token
    price × the arm's mean tokens, or its static arm where that gains no more than its
    margin). Predictions run on the router's trees packed by
    `rl.routing.fast_trees.PackedTrees` (the same numbers, well under a millisecond per
    request instead of sklearn's per-model call overhead)."""

    router: Any
    arms: Sequence[RAGConfig]
    _packed: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.router.n_arms != len(self.arms):
            raise ConfigError("arms", f"the router has {self.router.n_arms} arms, "
                                      f"{len(self.arms)} configs were given")

    def predict(self, X: np.ndarray) -> np.ndarray:
        """The router's predicted reward per arm (n, M), as `router.predict(X)`."""
        from rl.routing.fast_trees import PackedTrees

        r = self.router
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        if self._packed is None:
            packed = PackedTrees(r.models)
            # pooled: one model over (features, arm one-hot, arm descriptors) for every arm
            self._packed = (packed.with_tails(np.hstack([np.eye(r.n_arms), r._arms]))
                            if r.params.pooled else packed)
        raw = self._packed.predict(X)
        if r.params.pooled:
            raw = raw[:, :, 0]
        s = r.params.shrink
        return (1.0 - s) * r.arm_mean[None, :] + s * raw

    def act(self, X: np.ndarray) -> np.ndarray:
        from rl.routing.router import decide

        r = self.router
        return decide(self.predict(X), r.token_price, r.arm_tokens, r.margin, r.static_arm)

    def probs(self, X: np.ndarray) -> np.ndarray:
        return one_hot(self.act(X), len(self.arms))


@dataclass
class Exploring:
    """`policy` behind ε-uniform exploration, and optionally a `candidate` policy given
    `candidate_share` of the traffic (module docstring); `act` stays the greedy one."""

    policy: PerQueryPolicy
    epsilon: float = DEFAULT_EPSILON
    candidate: PerQueryPolicy | None = None
    candidate_share: float = 0.0

    def __post_init__(self):
        if not 0.0 <= self.epsilon <= 1.0:
            raise ConfigError("epsilon", f"a served policy explores with epsilon in "
                                         f"[0, 1], got {self.epsilon}")
        if not 0.0 <= self.candidate_share <= MAX_CANDIDATE_SHARE:
            raise ConfigError("candidate_share", f"must be in [0, {MAX_CANDIDATE_SHARE}], "
                                                 f"got {self.candidate_share}")
        if self.candidate_share > 0.0 and self.candidate is None:
            raise ConfigError("candidate_share", f"{self.candidate_share} > 0 needs a "
                                                 f"candidate policy")
        if self.epsilon + self.candidate_share > 1.0:
            raise ConfigError("epsilon", f"epsilon {self.epsilon} + candidate_share "
                                         f"{self.candidate_share} must not exceed 1")
        if self.candidate is not None:
            same_arms(self.policy, self.candidate)

    @property
    def arms(self) -> Sequence[RAGConfig]:
        return self.policy.arms

    def act(self, X: np.ndarray) -> np.ndarray:
        return self.policy.act(X)

    def probs(self, X: np.ndarray) -> np.ndarray:
        cand = self.candidate.probs(X) if self.candidate_share > 0.0 else None
        return explore_mix(self.policy.probs(X), self.epsilon, cand, self.candidate_share)


def same_arms(policy: PerQueryPolicy, candidate: PerQueryPolicy) -> None:
    """ConfigError naming `candidate` unless both policies choose among the same configs, in
    the same order (arm j must mean the same config in both, or a logged arm index would
    point at another config for the candidate's estimate)."""
    a = [c.config_hash for c in policy.arms]
    b = [c.config_hash for c in candidate.arms]
    if a != b:
        diff = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                    min(len(a), len(b)))
        raise ConfigError("candidate", f"the candidate policy's arms differ from the served "
                                       f"policy's ({len(b)} vs {len(a)} arms, first difference "
                                       f"at arm {diff}): both must share one portfolio")


# --------------------------------------------------------------------------- policy dirs


def save_policy(policy: PerQueryPolicy, path: str | Path, *, base_config: RAGConfig,
                names: Sequence[str] | None = None, feature_names: Sequence[str] = (),
                epsilon: float = DEFAULT_EPSILON, kind: str | None = None,
                details: dict[str, Any] | None = None) -> Path:
    """Write a policy directory (module docstring). `base_config`: the config whose retrievers
    and query formulation the featurizer must use at serving time (the one the policy was
    trained with); `names`: human names of the arms (default arm-<j>); `details`: a JSON
    record of the learner's own (e.g. `rl.routing.cascade.CascadePolicy.manifest`), written
    as policy.json's `details`. Returns the dir."""
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    arms = list(policy.arms)
    names = list(names) if names is not None else [f"arm-{j}" for j in range(len(arms))]
    if len(names) != len(arms):
        raise ConfigError("names", f"{len(names)} names for {len(arms)} arms")
    doc = {"kind": kind or type(policy).__name__, "epsilon": float(epsilon),
           "names": names, "arms": [c.model_dump(mode="json") for c in arms],
           "arm_hashes": [c.config_hash for c in arms],
           "base_config": base_config.model_dump(mode="json"),
           "feature_names": list(feature_names), "details": dict(details or {})}
    (d / MODEL_FILE).write_bytes(pickle.dumps(policy))
    (d / POLICY_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True))
    return d


@dataclass
class LoadedPolicy:
    """A policy directory read back: the policy, its manifest fields and a stable `policy_id`
    (12 hex of the manifest and model bytes); `details`: the learner's record (`save_policy`)."""

    policy: PerQueryPolicy
    names: list[str]
    base_config: RAGConfig
    epsilon: float
    feature_names: list[str]
    kind: str
    policy_id: str
    details: dict[str, Any] = field(default_factory=dict)


def load_policy(path: str | Path) -> LoadedPolicy:
    """Read a directory written by `save_policy`. Only load directories you wrote: the model
    is a pickle. Raises ConfigError naming `policy_dir` when files are missing or the arms'
    configs no longer hash as they did (written by code that hashed configs differently)."""
    import hashlib

    d = Path(path)
    if not (d / POLICY_FILE).exists() or not (d / MODEL_FILE).exists():
        raise ConfigError("policy_dir", f"{d} holds no {POLICY_FILE} + {MODEL_FILE}")
    raw_doc, raw_model = (d / POLICY_FILE).read_bytes(), (d / MODEL_FILE).read_bytes()
    doc = json.loads(raw_doc)
    policy = pickle.loads(raw_model)  # noqa: S301 - a directory this project wrote
    arms = [RAGConfig.from_dict(c, where=f"policy.arms.{j}") for j, c in enumerate(doc["arms"])]
    hashes = [c.config_hash for c in arms]
    if hashes != doc["arm_hashes"] or hashes != [c.config_hash for c in policy.arms]:
        raise ConfigError("policy_dir", f"{d}: arm configs hash differently than when saved")
    pid = hashlib.sha256(raw_doc + raw_model).hexdigest()[:12]
    return LoadedPolicy(policy, list(doc["names"]),
                        RAGConfig.from_dict(doc["base_config"], where="policy.base_config"),
                        float(doc["epsilon"]), list(doc.get("feature_names", [])),
                        str(doc["kind"]), pid, dict(doc.get("details") or {}))
