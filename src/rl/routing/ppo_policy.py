"""The per-query PPO policy: query features -> one config per query, through mixed
action heads over the config space (`rl.routing.heads.HeadLayout`) or one categorical head
over a fixed list of arms (`ArmLayout`), trained with RLlib PPO on the new API stack under a
mean-cost constraint (PPO-Lagrangian).

MDP: one step per query (gamma = GAE lambda = 0: the next query does not depend on this
decision). `PolicyEnv` observes a random training query's `QueryFeaturizer` features,
standardised with the training split's mean and std (clipped to +-10); the action decodes to a
`RAGConfig` (`HeadLayout.decode`, continuous heads snapped so the row cache hits); the reward is

    r_t = reward_t - lambda * cost_t

with reward_t the tuner's per-query reward of that config on that query and cost_t its tokens
in units of C_ref (`rl.routing.worlds`).

PPO-Lagrangian (`lagrange_update`): after every training iteration j, with c_j the mean cost of
the iteration's sampled steps and b the budget (the comparison baseline's mean cost: the bench
uses best-static's on valid),

    lambda_{j+1} = clip(lambda_j + eta * (c_j - b), 0, lambda_max)

(projected gradient ascent on the Lagrangian's dual); lambda reaches the env runners through
`foreach_env_runner` before the next iteration samples.

Warm start (`rl.routing.warm_start`, optional): before PPO samples, the module is cloned to
known-good choices (the best static config, a router's per-query picks); each clone's greedy
policy is scored on valid, the best one is loaded into RLlib's learner and env runners and is
model selection's iteration-0 candidate, so PPO starts at the baseline and the kept module is
never worse on valid than it (by the rule below).

Model selection (`rl.routing.selection.replaces`): every `eval_every` iterations (and after
the last) the greedy policy serves the valid queries; a checkpoint replaces the incumbent (the
warm start, or the last checkpoint kept) when it is feasible (valid mean cost <= b * (1 +
slack)) and the incumbent is not, or, both feasible, when its realised mean reward on valid is
higher and (`train.selection: evidence`, the default) the paired bootstrap 95% CI of its
per-query gain over the incumbent is above 0; both infeasible: the lower cost. Test is never
seen here.

`PerQueryPPO` is what serving calls: `act(features) -> list[RAGConfig]` (greedy),
`sample(features, rng) -> (configs, propensities)` (the propensity of each sampled decision:
the product of its categorical head probabilities and, per acting continuous head, the
probability mass of its snapped value), `save(dir)` / `load(dir)` (no Ray needed to load and
act). Checkpoints (`Checkpointing`) hold the RLlib algorithm and the loop state, so `resume`
continues a killed run; metrics go to MLflow through `rl.common.tracking` when a tracking URI
is given.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rag.config import RAGConfig
from rl.kernel.settings import TunerSettings
from rl.routing.heads import ArmLayout, HeadLayout
from rl.routing.run_log import PolicyRunLog
from rl.routing.selection import replaces
from rl.routing.settings import PPOPolicySettings
from rl.routing.warm_start import WarmStart
from rl.routing.worlds import QueryWorld, RoleData

_BUNDLES: dict[str, dict[str, Any]] = {}
OBS_CLIP = 10.0


@dataclass(frozen=True)
class Checkpointing:
    """Where `PerQueryPPO.train` keeps its state: after each iteration the RLlib algorithm
    (`dir`/algo), the loop state (`dir`/loop.json: iteration, lambda, best record, history) and
    the best module (`dir`/best.pt); `resume`: continue from the state found in `dir` (a
    fresh start when it holds none)."""

    dir: str | Path
    resume: bool = False


def lagrange_update(lam: float, mean_cost: float, budget: float, lr: float,
                    lam_max: float) -> float:
    """One projected ascent step: clip(lam + lr * (mean_cost - budget), 0, lam_max)."""
    return float(np.clip(lam + lr * (mean_cost - budget), 0.0, lam_max))


class PolicyEnv(gym.Env):
    """One-step episodes over the queries of a bundle registered in this process
    (`env_config["bundle"]`: {"world", "layout", "X", "base"}; "base": the base policy's
    config per query for a layout with a `defer` head, else None; the evaluator-backed world
    lives in the driver, so the policy samples there: num_env_runners = 0)."""

    def __init__(self, env_config: dict | None = None):
        cfg = dict(env_config or {})
        b = _BUNDLES[cfg["bundle"]]
        self.world: QueryWorld = b["world"]
        self.layout: HeadLayout = b["layout"]
        self.X = np.asarray(b["X"], dtype=np.float32)
        self.base: Sequence[RAGConfig] | None = b.get("base")
        self.lam = float(cfg.get("lam", 0.0))
        self.costs: list[float] = []
        self.observation_space = gym.spaces.Box(-OBS_CLIP, OBS_CLIP, shape=(self.X.shape[1],),
                                                dtype=np.float32)
        self.action_space = self.layout.action_space()
        self._rng = np.random.default_rng(cfg.get("seed", 0))
        self._i = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._i = int(self._rng.integers(len(self.X)))
        return self.X[self._i], {}

    def step(self, action):
        base = None if self.base is None else self.base[self._i]
        o = self.world.outcome(self._i, self.layout.decode(action, base))
        self.costs.append(o.cost)
        return self.X[self._i], o.reward - self.lam * o.cost, True, False, {"cost": o.cost}


def _envs(runner) -> list[PolicyEnv]:
    env = runner.env.unwrapped  # RLlib's vector env (gymnasium wrappers do not forward `envs`)
    return [e.unwrapped for e in getattr(env, "envs", [env])]


def _set_lambda(lam: float) -> Callable[[Any], int]:
    def f(runner) -> int:
        for e in _envs(runner):
            e.lam = lam
        return 1
    return f


def _pop_costs(runner) -> list[float]:
    out: list[float] = []
    for e in _envs(runner):
        out.extend(e.costs)
        e.costs = []
    return out


class PerQueryPPO:
    """A trained (or loadable) per-query policy: an RLlib PPO module over `layout`'s heads and
    the feature standardisation (`mean`, `std`) of its training split."""

    def __init__(self, layout: HeadLayout | ArmLayout, settings: PPOPolicySettings, mean: np.ndarray,
                 std: np.ndarray, module: Any = None, lam: float = 0.0,
                 meta: dict | None = None):
        self.layout, self.settings = layout, settings
        self.mean, self.std = np.asarray(mean, np.float32), np.asarray(std, np.float32)
        self.module, self.lam, self.meta = module, lam, dict(meta or {})

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def create(cls, layout: HeadLayout | ArmLayout, settings: PPOPolicySettings, X_train: np.ndarray
               ) -> PerQueryPPO:
        X = np.asarray(X_train, np.float64)
        std = X.std(axis=0)
        return cls(layout, settings, X.mean(axis=0), np.where(std > 1e-8, std, 1.0),
                   lam=settings.lagrange.init)

    def standardise(self, features: np.ndarray) -> np.ndarray:
        z = (np.asarray(features, np.float32) - self.mean) / self.std
        return np.clip(z, -OBS_CLIP, OBS_CLIP).astype(np.float32)

    def spec(self) -> Any:
        from rl.routing.ppo_module import module_spec

        obs = gym.spaces.Box(-OBS_CLIP, OBS_CLIP, shape=(len(self.mean),), dtype=np.float32)
        return module_spec(obs, self.layout.action_space(), list(self.settings.train.hidden),
                           self.layout.gates_spec())

    # ---- training -----------------------------------------------------------------------
    def train(self, train: RoleData, valid: RoleData, budget: float, seed: int = 0, *,
              warm: Sequence[WarmStart] = (), checkpointing: Checkpointing | None = None,
              tracking_uri: str | None = None, run_name: str = "ppo-policy",
              log: Callable[[str], None] = print) -> list[dict[str, Any]]:
        """Train on `train`, select on `valid` (module docstring); `budget`: the mean cost
        bound in C_ref units; `warm`: behaviour-cloning starts (`rl.routing.warm_start`), the
        best on valid is where PPO starts and the first model selection candidate (iteration
        0); `checkpointing`: where the state is saved after each iteration, and whether to
        resume from it (None: nothing saved); `tracking_uri` / `run_name`: the MLflow run
        (`rl.routing.run_log.PolicyRunLog`; no run without a URI); `log`: one line per
        iteration. Returns one record per iteration (and per warm start, iteration 0)."""
        from rl.common.rllib import ppo_config
        from rl.common.runtime import init_ray

        init_ray()
        t, lg = self.settings.train, self.settings.lagrange
        key = f"ppo-policy-{id(self)}-{seed}"
        self.layout.check_base(train.base, len(train.X), "train.base")
        self.layout.check_base(valid.base, len(valid.X), "valid.base")
        _BUNDLES[key] = {"world": train.world, "layout": self.layout,
                         "X": self.standardise(train.X), "base": train.base}
        cfg = ppo_config(PolicyEnv, {"bundle": key, "seed": seed, "lam": self.lam},
                         seed=seed, train_batch_size=t.batch, module=self.spec(),
                         disable_env_checking=True, lr=t.lr, gamma=0.0, lambda_=0.0,
                         minibatch_size=t.minibatch, num_epochs=t.epochs,
                         entropy_coeff=t.entropy_coeff, use_kl_loss=False)
        algo = cfg.build_algo()
        ckpt = Path(checkpointing.dir) if checkpointing is not None else None
        state = {"iter": 0, "lam": self.lam, "best": None, "history": []}
        if ckpt is not None and checkpointing.resume and (ckpt / "loop.json").exists():
            algo.restore_from_path(str((ckpt / "algo").resolve()))
            state = json.loads((ckpt / "loop.json").read_text())
            self.lam = state["lam"]
            algo.env_runner_group.foreach_env_runner(_set_lambda(self.lam))
            log(f"resumed at iteration {state['iter']} (lambda {self.lam:.3f})")
        best_state = (self._module_state(ckpt / "best.pt") if ckpt is not None and
                      state["best"] is not None else None)
        mlf = PolicyRunLog(tracking_uri, run_name, self.settings, seed, budget)
        try:
            if warm and state["iter"] == 0:
                best_state = self._warm_start(algo, warm, train, valid, budget, seed, state,
                                              log)
                if ckpt is not None:
                    _save_torch(best_state, ckpt / "best.pt")
            for it in range(state["iter"], t.iters):
                t0 = time.perf_counter()
                res = algo.train()
                costs = [c for cs in algo.env_runner_group.foreach_env_runner(_pop_costs)
                         for c in cs]
                mean_cost = float(np.mean(costs)) if costs else float("nan")
                if costs:
                    self.lam = lagrange_update(self.lam, mean_cost, budget, lg.lr, lg.max)
                algo.env_runner_group.foreach_env_runner(_set_lambda(self.lam))
                rec = {"iter": it + 1, "return": float(res.get("env_runners", {}).get(
                    "episode_return_mean", np.nan)), "cost": mean_cost, "lambda": self.lam,
                       "s": round(time.perf_counter() - t0, 2)}
                if (it + 1) % t.eval_every == 0 or it + 1 == t.iters:
                    self.module = algo.get_module()
                    outs = valid.world.outcomes(self.act(valid.X, valid.base))
                    per_query = [o.reward for o in outs]
                    rec["valid_reward"] = float(np.mean(per_query))
                    rec["valid_cost"] = float(np.mean([o.cost for o in outs]))
                    if replaces(rec, state["best"], budget * (1 + lg.slack), per_query,
                                state.get("best_valid_rewards"), t.selection):
                        state["best"] = {k: rec[k] for k in ("iter", "valid_reward",
                                                             "valid_cost")}
                        state["best"]["start"] = self.meta.get("warm_start")
                        state["best_valid_rewards"] = per_query
                        best_state = _cpu_state(self.module)
                        if ckpt is not None:
                            _save_torch(best_state, ckpt / "best.pt")
                state["history"].append(rec)
                state["iter"], state["lam"] = it + 1, self.lam
                mlf.log(rec)
                log(_line(rec))
                if ckpt is not None:
                    ckpt.mkdir(parents=True, exist_ok=True)
                    algo.save_to_path(str((ckpt / "algo").resolve()))
                    (ckpt / "loop.json").write_text(json.dumps(state))
            self.module = algo.get_module()
            if best_state is not None:
                self.module.set_state(best_state)
            self.module = self._standalone(_cpu_state(self.module))
            self.meta.update({"seed": seed, "budget": budget, "best": state["best"],
                              "lambda": self.lam})
        finally:
            mlf.close(state.get("best"))
            algo.stop()
            _BUNDLES.pop(key, None)
        return state["history"]

    def _warm_start(self, algo: Any, warm: Sequence[WarmStart], train: RoleData,
                    valid: RoleData, budget: float, seed: int, state: dict,
                    log: Callable[[str], None]) -> dict:
        """The best warm start on valid (`rl.routing.warm_start.choose_start`) goes to RLlib's
        learner and env runners; returns its module state."""
        import tempfile

        from rl.routing.warm_start import MODULE_COMPONENT, choose_start

        recs, best, module, rewards = choose_start(
            self, warm, train, valid, budget * (1 + self.settings.lagrange.slack), seed)
        for rec in recs:
            state["history"].append(rec)
            log(_line(rec))
        state["best"] = {k: best[k] for k in ("iter", "start", "valid_reward", "valid_cost")}
        state["best_valid_rewards"] = rewards
        with tempfile.TemporaryDirectory() as d:
            module.save_to_path(d)
            algo.restore_from_path(d, component=MODULE_COMPONENT)
        self.meta["warm_start"] = best["start"]
        self.module = module
        return _cpu_state(module)

    def _standalone(self, state: dict) -> Any:
        module = self.spec().build()
        module.set_state(state)
        module.eval()
        return module

    @staticmethod
    def _module_state(path: Path) -> dict | None:
        import torch

        return torch.load(path, weights_only=False) if path.exists() else None

    # ---- acting -------------------------------------------------------------------------
    def _heads(self, features: np.ndarray) -> dict[str, np.ndarray]:
        """Per head: logits (Discrete, n_rows x n) or (mean, std) raw Gaussian (Box)."""
        import torch

        with torch.no_grad():
            out = self.module.forward_inference(
                {"obs": torch.as_tensor(self.standardise(np.atleast_2d(features)))})
        z = out["action_dist_inputs"].numpy().astype(np.float64)
        heads, j = {}, 0
        for h in self.layout.names:
            n = self.layout.discrete.get(h, 2)
            heads[h] = z[:, j:j + n]
            j += n
        return heads

    def probs(self, features: np.ndarray) -> dict[str, np.ndarray]:
        """Per Discrete head its action probabilities (n_rows x n); per Box head its raw
        Gaussian (mean, std) columns."""
        out = {}
        for h, z in self._heads(features).items():
            if h in self.layout.discrete:
                e = np.exp(z - z.max(axis=1, keepdims=True))
                out[h] = e / e.sum(axis=1, keepdims=True)
            else:
                out[h] = np.column_stack([z[:, 0], np.exp(z[:, 1])])
        return out

    def act(self, features: np.ndarray, base: Sequence[RAGConfig] | None = None
            ) -> list[RAGConfig]:
        """The greedy config for each row of `features` (the observation features the policy
        was trained on); `base`: the base policy's config per row (a `defer` head needs it)."""
        P = self.probs(features)
        n = len(next(iter(P.values())))
        self.layout.check_base(base, n, "base")
        return [self.layout.decode({h: (int(P[h][i].argmax()) if h in self.layout.discrete
                                        else [(np.clip(P[h][i, 0], -1, 1) + 1) / 2])
                                    for h in self.layout.names},
                                   None if base is None else base[i]) for i in range(n)]

    def deferred(self, features: np.ndarray) -> np.ndarray:
        """Per row, whether the greedy action defers to the base policy (all False without a
        `defer` head)."""
        if not self.layout.defers:
            return np.zeros(len(np.atleast_2d(features)), dtype=bool)
        return self.probs(features)["defer"].argmax(axis=1) == 1

    def sample(self, features: np.ndarray, rng: np.random.Generator,
               base: Sequence[RAGConfig] | None = None
               ) -> tuple[list[RAGConfig], np.ndarray]:
        """A config per row drawn from the policy, and the propensity of each draw (module
        docstring: categorical probabilities times the snapped-value masses of the acting
        continuous heads; heads that do not act do not count). A draw that defers takes
        `base[i]`; its propensity is the defer head's probability of deferring."""
        P = self.probs(features)
        n = len(next(iter(P.values())))
        self.layout.check_base(base, n, "base")
        configs, props = [], np.ones(n)
        for i in range(n):
            a: dict[str, Any] = {}
            for h in self.layout.names:
                if h in self.layout.discrete:
                    a[h] = int(rng.choice(len(P[h][i]), p=P[h][i]))
                else:
                    x = rng.normal(P[h][i, 0], P[h][i, 1])
                    a[h] = [(np.clip(x, -1, 1) + 1) / 2]
            act = self.layout.active(a)
            for h in self.layout.names:
                if not act[h]:
                    continue
                if h in self.layout.discrete:
                    props[i] *= P[h][i, a[h]]
                else:
                    box = self.layout.boxes[h]
                    props[i] *= box.bin_masses(P[h][i, 0], P[h][i, 1])[box.value(a[h][0])]
            configs.append(self.layout.decode(a, None if base is None else base[i]))
        return configs, props

    # ---- persistence --------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """module.pt (the RLModule state), policy.json (settings, layout inputs: the tuner
        settings, and the arms' configs for an `ArmLayout`; standardisation, lambda, meta)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        _save_torch(_cpu_state(self.module), d / "module.pt")
        arms = isinstance(self.layout, ArmLayout)
        tuner = self.layout.policy if arms else self.layout.space.policy
        extra = {"arms": [c.model_dump(mode="json") for c in self.layout.configs]} if arms else {}
        (d / "policy.json").write_text(json.dumps({
            "settings": self.settings.model_dump(mode="json"),
            "tuner": tuner.model_dump(mode="json", by_alias=True),
            "conversational": self.layout.conversational, **extra, "mean": self.mean.tolist(),
            "std": self.std.tolist(), "lambda": self.lam, "meta": self.meta}, indent=1))
        return d

    @classmethod
    def load(cls, directory: str | Path) -> PerQueryPPO:
        d = Path(directory)
        j = json.loads((d / "policy.json").read_text())
        tuner = TunerSettings.from_mapping(j["tuner"])
        heads = j["settings"].setdefault("heads", {})
        if "normalisations" not in heads:
            # saved before the normalisation head: its hybrids used the base config's only
            heads["normalisations"] = [tuner.base_config().normalisation]
        settings = PPOPolicySettings.from_mapping(j["settings"])
        layout: HeadLayout | ArmLayout = (
            ArmLayout([RAGConfig.from_dict(c) for c in j["arms"]], tuner) if "arms" in j
            else HeadLayout(settings.heads, tuner, j["conversational"]))
        pol = cls(layout, settings, np.array(j["mean"]), np.array(j["std"]),
                  lam=j["lambda"], meta=j["meta"])
        pol.module = pol._standalone(cls._module_state(d / "module.pt"))
        return pol


def _line(rec: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in rec.items())


def _cpu_state(module: Any) -> dict:
    import copy

    return copy.deepcopy(module.get_state())


def _save_torch(state: dict, path: Path) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
