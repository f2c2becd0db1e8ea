"""The per-query PPO policy as a servable `PerQueryPolicy` (`rl.routing.base`).

`PerQueryPPO` picks a config from the whole space per query; the Serve app, the decision logs
and the OPE code work over a fixed list of arms (one pipeline per arm, built when a replica
starts). `PPOPortfolioPolicy` fixes that list when it is made: every config the PPO policy
picks greedily on reference queries (e.g. its train and valid queries) and, for a residual
policy (a `defer` head), every arm of its base router, so a deferral is always an arm.

    served = PPOPortfolioPolicy(ppo, X_reference, base=ResidualBase(router, arms, price, s))
    save_policy(served, "runs/policy/ppo", base_config=..., feature_names=...)

Per query it builds PPO's observation as in training (the query features; for a residual
policy followed by the router's view of the query, `rl.routing.router.router_view`), takes
PPO's greedy config and returns its arm. A greedy config outside the list (a query unlike the
reference ones) is served the arm PPO gives the highest probability (`arm_probs`: for a
residual policy P(defer) on the router's pick plus P(act) times its own heads' probability of
the arm's action, `HeadLayout.encode`; an arm its heads cannot express gets none; where two
actions give one config, e.g. two rerank depths both raised to k, only the encoded one counts)
and is counted in `off_list`. `probs` is one-hot on the chosen arm (greedy, like `RouterPolicy`);
`Exploring` adds the ε every served policy keeps.

Pickling carries the PPO policy's saved files (`PerQueryPPO.save`), so `save_policy` /
`load_policy` round-trip it; loading rebuilds the RLModule (Ray RLlib is imported).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rag.config import RAGConfig
from rl.routing.router import SupervisedRouter, arm_features, router_view

PPO_FILES = ("module.pt", "policy.json")


@dataclass
class ResidualBase:
    """The base policy a residual PPO policy defers to: the supervised router over `arms`,
    held to its token `price`, with `static_arm` the reference arm of its view (as in
    training: `rl.routing.router.stacked`)."""

    router: SupervisedRouter
    arms: list[RAGConfig]
    price: float = 0.0
    static_arm: int = 0
    arm_desc: np.ndarray = field(init=False, repr=False)
    """`arm_features(arms)`, computed once (not per request)."""

    def __post_init__(self) -> None:
        self.arm_desc = arm_features(self.arms)

    def view(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(base pick per row, the router's view features (n, len(ROUTER_FEATURE_NAMES)))."""
        return router_view(self.router, self.price, self.static_arm, self.arm_desc,
                           self.router.predict(X))

    def observe(self, X: np.ndarray) -> tuple[np.ndarray, list[RAGConfig]]:
        """A residual policy's observation rows for query features `X` (the features, then
        the router's view) and the base config per row."""
        picks, F = self.view(X)
        return np.hstack([X, F]), [self.arms[j] for j in picks]


class PPOPortfolioPolicy:
    """See the module docstring."""

    def __init__(self, ppo, reference: np.ndarray, base: ResidualBase | None = None):
        if ppo.layout.defers and base is None:
            raise ValueError("the PPO policy has a defer head: give its base (ResidualBase)")
        if base is not None and not ppo.layout.defers:
            raise ValueError("a base was given, but the PPO policy has no defer head")
        self.ppo, self.base = ppo, base
        arms: list[RAGConfig] = [] if base is None else list(base.arms)
        seen = {c.config_hash for c in arms}
        obs, base_cfg = self.observe(reference)
        for c in ppo.act(obs, base_cfg):
            if c.config_hash not in seen:
                seen.add(c.config_hash)
                arms.append(c)
        self.arms: list[RAGConfig] = arms
        self._index = {c.config_hash: j for j, c in enumerate(arms)}
        self.off_list = 0
        """Queries whose greedy config was not an arm (served the most probable arm)."""

    def observe(self, X: np.ndarray) -> tuple[np.ndarray, list[RAGConfig] | None]:
        """PPO's observation rows for query features `X`, and the base config per row."""
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        return (X, None) if self.base is None else self.base.observe(X)

    def act(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        obs, base_cfg = self.observe(X)
        configs = self.ppo.act(obs, base_cfg)
        out = np.array([self._index.get(c.config_hash, -1) for c in configs], dtype=np.int64)
        missing = np.flatnonzero(out < 0)
        if missing.size:
            self.off_list += int(missing.size)
            out[missing] = self.arm_probs(X[missing]).argmax(axis=1)
        return out

    def probs(self, X: np.ndarray) -> np.ndarray:
        a = self.act(X)
        P = np.zeros((len(a), len(self.arms)))
        P[np.arange(len(a)), a] = 1.0
        return P

    def arm_probs(self, X: np.ndarray) -> np.ndarray:
        """(n, len(arms)): the probability PPO's action distribution puts on each arm."""
        return self.config_probs(X, self.arms)

    def config_probs(self, X: np.ndarray, configs: list[RAGConfig]) -> np.ndarray:
        """(n, len(configs)): the probability PPO's action distribution puts on each config
        for each query (module docstring: P(defer) on the row's base config plus P(act)
        times the own heads' probability of the config's action)."""
        obs, base_cfg = self.observe(X)
        layout = self.ppo.layout
        P = self.ppo.probs(obs)
        n = len(obs)
        own = np.zeros((n, len(configs)))
        for j, c in enumerate(configs):
            action, exact = layout.encode(c)
            if not exact:
                continue
            active = layout.active(action)
            p = np.ones(n)
            for h in layout.names:
                if not active[h] or h == "defer":
                    continue
                if h in layout.discrete:
                    p *= P[h][:, int(np.asarray(action[h]).reshape(-1)[0])]
                else:
                    box = layout.boxes[h]
                    v = box.value(float(np.asarray(action[h]).reshape(-1)[0]))
                    p *= np.array([box.bin_masses(m, sd)[v] for m, sd in P[h]])
            own[:, j] = p
        if base_cfg is None:
            return own
        defer = P["defer"][:, 1]
        same = np.array([[c.config_hash == b.config_hash for c in configs] for b in base_cfg])
        return (1.0 - defer)[:, None] * own + defer[:, None] * same

    # ---- pickling: the RLModule travels as PerQueryPPO's saved files ----------------------
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        with tempfile.TemporaryDirectory() as d:
            self.ppo.save(d)
            state["ppo"] = {f: (Path(d) / f).read_bytes() for f in PPO_FILES}
        return state

    def __setstate__(self, state: dict) -> None:
        from rl.routing.ppo_policy import PerQueryPPO

        files = state.pop("ppo")
        with tempfile.TemporaryDirectory() as d:
            for f, b in files.items():
                (Path(d) / f).write_bytes(b)
            state["ppo"] = PerQueryPPO.load(d)
        self.__dict__.update(state)

