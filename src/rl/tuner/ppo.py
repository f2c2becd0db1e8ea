"""The PPO tuner: RLlib PPO (new API stack) on TunerEnv's mixed action heads.

    trainer = PPOTuner(evaluator, policy)        # Ray starts locally unless already up
    result  = trainer.train(iterations=5)        # TuneResult: best config, curve, budget
    trainer.save(path) / PPOTuner.restore(path)  # checkpoints (RLlib's own format)

One iteration collects `ppo.train_batch_size` env steps (config evaluations) with the local env
runner, or with `ppo.num_env_runners` remote env runners on any node of the cluster, each
building its env from `rl.tuner.env.env_spec` (RLlib sized by `rl.common.rllib.ppo_config`),
and runs `num_epochs` of minibatch SGD:
clip 0.2, an entropy bonus, γ/GAE λ 0.99/0.95 in delta mode and 0/0 in absolute mode, the KL
penalty optional, all from `configs/rl/tuner.yaml` (which records why those values). The categorical heads (variant, k,
rerank, prompt, and the space's extra Discrete heads) and the Gaussian Box heads (fusion weight,
and mmr_lambda / rerank_mix / abstain_threshold where the space has them: `rl.kernel.actions`)
share one MLP torso (RLlib's default module for a Dict action space).

The *greedy config* of a run is the deterministic action from the reset state, rolled for one
read-out episode, decoded exactly as training decodes it: RLlib's module-to-env pipeline
unsquashes each Gaussian Box head (the fusion weight, ...) from [-1, 1] to its bounds
(`config.normalize_actions`, RLlib's default; `NormalizeAndClipActions`), so the read-out
passes the raw module output through that same connector piece (`env_action`) before
`ConfigSpace.to_config`: the config it settles on most often. Budgets, the incumbent, the curve and `history` are read from
the step records in each training result (`rl.tuner.env.step_records`), never from an env
object, so they are the same with remote env runners. The *recommendation* (`best_config`) is
the greedy config when its read-out reward is at least the incumbent's (the best config PPO
evaluated while training, by mean observed reward: `rl.tuner.results.Incumbent`), else the
incumbent: a policy that has not converged within the budget should not displace the best
evidence it gathered.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.common.rllib import ppo_config, steps_per_iteration
from rl.common.runtime import init_ray
from rl.kernel.evaluator import TunerEvaluator
from rl.kernel.settings import TunerSettings
from rl.tuner.env import (
    TunerEnv,
    env_spec,
    log_step_records,
    register_evaluator,
    register_tuner_env,
    step_records,
)
from rl.tuner.results import TuneResult, curve_from_history, incumbent


class PPOTuner:
    def __init__(self, evaluator: TunerEvaluator, policy: TunerSettings | None = None,
                 seed: int | None = None, dataset: str | None = None):
        """`dataset`: what a remote env runner opens (a built-in name or a path every node
        reads; default: the evaluator's dataset name). The runners' evaluators use the
        driver evaluator's cache root, so on shared storage they share its tables."""
        self.ev = evaluator
        self.policy = policy or evaluator.policy
        self.seed = self.policy.seed if seed is None else seed
        self.key = register_evaluator(f"tuner-{uuid.uuid4().hex[:8]}", evaluator)
        if dataset is None and self.policy.ppo.num_env_runners and \
                not evaluator.data.dataset.builtin:
            raise ConfigError("policy.ppo.num_env_runners",
                              f"remote env runners reopen the data: pass the path of "
                              f"{evaluator.data.name!r} (PPOTuner(..., dataset=path))")
        self.spec = env_spec(dataset or evaluator.data.name, self.policy, self.seed,
                             evaluator.root)
        self.algo = None
        self.history: list[dict[str, Any]] = []
        """Every training step so far, from the results (`rl.tuner.env.step_records`): the
        env's step fields, `config` (a RAGConfig), `runner` and `node_id`."""
        self._states: list[np.ndarray] = []  # the matching feature vectors (read-out scaler)

    def config(self):
        """The RLlib PPOConfig (`rl.common.rllib.ppo_config`) with `policy.ppo`'s settings."""
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

        p = self.policy.ppo
        gamma, gae_lambda = self.policy.ppo_discount()
        return ppo_config(register_tuner_env(), {**self.spec, "evaluator": self.key},
                          seed=self.seed, on_sample_end=log_step_records, runners=p,
                          train_batch_size=p.train_batch_size,
                          module=DefaultModelConfig(fcnet_hiddens=list(p.hidden),
                                                    vf_share_layers=False),
                          smoothing_episodes=5,
                          lr=p.lr, clip_param=p.clip_param, lambda_=gae_lambda, gamma=gamma,
                          kl_target=p.kl_target, use_kl_loss=p.use_kl_loss,
                          entropy_coeff=p.entropy_coeff, minibatch_size=p.minibatch_size,
                          num_epochs=p.num_epochs)

    def build(self) -> None:
        init_ray()
        if self.algo is None:
            self.algo = self.config().build_algo()

    @property
    def env(self) -> TunerEnv:
        """The driver's env (`num_env_runners=0` only: remote runners keep theirs; read
        `history` for the steps wherever they ran)."""
        runner_env = self.algo.env_runner.env if self.algo.env_runner is not None else None
        if runner_env is None:
            raise RuntimeError("the envs live in the remote env runners "
                               "(ppo.num_env_runners > 0): read PPOTuner.history")
        return runner_env.unwrapped.envs[0].unwrapped

    @property
    def steps_per_iteration(self) -> int:
        """Env steps (evaluations) one training iteration takes."""
        p = self.policy.ppo
        return steps_per_iteration(p.train_batch_size, p.num_env_runners)

    def _collect(self, result: dict[str, Any]) -> list[dict[str, Any]]:
        """Append `result`'s step records to `history` (configs as RAGConfigs, also added to
        the evaluator's `seen`) and return them."""
        new = []
        for rec in step_records(result):
            cfg = RAGConfig.from_dict(rec["config"])
            self.ev.seen.setdefault(cfg.config_hash, cfg)
            self._states.append(np.asarray(rec.pop("state"), dtype=np.float64))
            new.append({**rec, "config": cfg})
        self.history.extend(new)
        return new

    def train(self, iterations: int, log=None) -> TuneResult:
        """`iterations` PPO iterations, then one read-out episode of greedy actions.
        `log(iteration, metrics)` after each iteration (MLflow hook).

        The recommendation is the greedy config when its mean read-out reward is at least the
        mean observed reward of the best config PPO evaluated while training (the incumbent);
        otherwise the incumbent. Read-out steps are evaluations and count in the budget.
        """
        return self._run(lambda it, hist: it < iterations, log)

    def train_configs(self, budget: int, max_steps: int | None = None, log=None) -> TuneResult:
        """Train while another iteration cannot take the run past `budget` distinct configs
        (an iteration's `train_batch_size` steps and the read-out's `episode.length` are
        reserved as if every step were new), or `max_steps` steps (default 10 × budget): the
        budget in what a run costs when revisits read cached tables. Never exceeds `budget`;
        may stop short of it by up to one iteration's steps."""
        cap = max_steps or 10 * budget
        step = self.steps_per_iteration
        room = budget - self.policy.episode.length - step
        if room < 0:
            raise ConfigError("budget", f"{budget} distinct configs cannot hold one PPO "
                                        f"iteration ({step} steps) and the read-out "
                                        f"({self.policy.episode.length}); give at least "
                                        f"{step + self.policy.episode.length}")
        return self._run(lambda it, hist: len({h["config_hash"] for h in hist}) <= room
                         and len(hist) + step <= cap, log)

    def _run(self, go, log=None) -> TuneResult:
        """Train while `go(iterations done, this call's steps)`, then read out; the result
        covers this call's steps (a second call on the same tuner starts a new budget)."""
        self.build()
        t0 = time.perf_counter()
        start = len(self.history)
        it = 0
        while go(it, self.history[start:]):
            res = self.algo.train()
            new = self._collect(res)
            if log is not None:
                log(it, _iteration_metrics(res, new))
            it += 1
        iterations = it
        train_hist = list(self.history[start:])
        if not train_hist:
            raise RuntimeError("PPO training reported no env steps (rl.tuner.env."
                               "log_step_records did not run on the env runners)")
        greedy, readout = self.greedy_config()
        inc_hash, inc_mean = incumbent(train_hist)
        g_mean = float(np.mean([h["reward"] for h in readout
                                if h["config_hash"] == greedy.config_hash]))
        best = greedy if g_mean >= inc_mean else self.ev.seen[inc_hash]
        hist = train_hist + readout
        return TuneResult("ppo", best, len(hist), curve_from_history(hist),
                          time.perf_counter() - t0,
                          {"greedy_config": greedy, "greedy_readout_reward": g_mean,
                           "incumbent_hash": inc_hash, "incumbent_reward": inc_mean,
                           "iterations": iterations, "readout_steps": len(readout)})

    def greedy_action(self, obs: np.ndarray) -> dict[str, Any]:
        """The deterministic action for `obs` as the env receives it: the module's mode (argmax
        heads, the Gaussian mean) put through the training pipeline's action unsquashing."""
        import torch

        module = self.algo.get_module()
        with torch.no_grad():
            out = module.forward_inference({"obs": torch.as_tensor(obs[None])})
            dist = module.get_inference_action_dist_cls().from_logits(
                out["action_dist_inputs"]).to_deterministic()
            act = dist.sample()
        raw = {k: np.asarray(v[0].cpu().numpy()) for k, v in act.items()}
        # the env runner's own module-to-env pipeline: what every training step went through
        return env_action(self.algo.env_runner._module_to_env, raw)

    def greedy_config(self) -> tuple[RAGConfig, list[dict[str, Any]]]:
        """Roll one episode of greedy actions in a scratch env (same feature scaling); the most
        frequent config and the read-out steps (each one an evaluation)."""
        env = TunerEnv({"seed": self.seed + 1}, evaluator=self.ev)
        env._states = list(self._states)  # the training steps' features, wherever they ran
        obs, _ = env.reset()
        counts: Counter[str] = Counter()
        by_hash: dict[str, RAGConfig] = {}
        for _ in range(env.length):
            action = self.greedy_action(obs)
            cfg = env.space.to_config(action, env.current)
            counts[cfg.config_hash] += 1
            by_hash[cfg.config_hash] = cfg
            obs, *_ = env.step(action)
        return by_hash[counts.most_common(1)[0][0]], env.history

    def save(self, path: str | Path) -> str:
        return str(self.algo.save_to_path(str(Path(path).resolve())))

    def restore(self, path: str | Path) -> None:
        self.build()
        self.algo.restore_from_path(str(Path(path).resolve()))
        # the learner holds the restored weights; push them to the env runner's module too
        weights = self.algo.learner_group.get_weights()["default_policy"]
        self.algo.get_module().set_state(weights)

    def stop(self) -> None:
        if self.algo is not None:
            self.algo.stop()
            self.algo = None


def env_action(module_to_env: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` (one module output: Box heads in the module's [-1, 1] scale) as the env receives
    it from `module_to_env`, an RLlib module-to-env pipeline: its `NormalizeAndClipActions`
    piece unsquashes Box heads to their bounds (`normalize_actions`) or clips them
    (`clip_actions`); Discrete heads pass unchanged. A pipeline without that piece (default
    connectors switched off) hands the env the raw action, and so does this."""
    from ray.rllib.connectors.module_to_env import NormalizeAndClipActions
    from ray.rllib.core.columns import Columns

    pieces = [c for c in module_to_env.connectors if isinstance(c, NormalizeAndClipActions)]
    if not pieces:
        return raw
    batch = pieces[0](rl_module=None, batch={Columns.ACTIONS: [raw]}, episodes=[])
    return batch.get(Columns.ACTIONS_FOR_ENV, batch[Columns.ACTIONS])[0]


def _iteration_metrics(res: dict[str, Any], hist: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    if hist:
        for k in ("reward", "faithfulness", "relevancy", "p95_latency_ms", "cost"):
            out[k] = float(np.mean([h[k] for h in hist]))
        out["gate_breaches"] = float(sum(not h["gates_passed"] for h in hist))
    learner = (res.get("learners") or {}).get("default_policy") or {}
    for k in ("policy_loss", "vf_loss", "entropy", "mean_kl_loss"):
        if k in learner:
            out[f"losses/{k}"] = float(learner[k])
    return out
