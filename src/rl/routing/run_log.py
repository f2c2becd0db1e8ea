"""MLflow metrics of one per-query PPO policy training run (`rl.routing.ppo_policy`): its
parameters, one step of `charts/*` per iteration, and the chosen checkpoint as `best/*`."""

from __future__ import annotations

import numpy as np

from rl.routing.settings import PPOPolicySettings


class PolicyRunLog:
    """Per-iteration metrics of one training run (no-op without a tracking URI)."""

    def __init__(self, uri: str | None, run_name: str, settings: PPOPolicySettings, seed: int,
                 budget: float):
        self.run = None
        if not uri:
            return
        import mlflow

        from rl.common.tracking import code_commit, set_experiment

        set_experiment("ppo-policy", uri)
        self.run = mlflow.start_run(run_name=run_name)
        mlflow.log_params({"seed": seed, "budget": budget, "iters": settings.train.iters,
                           "batch": settings.train.batch, "lr": settings.train.lr,
                           "lagrange_lr": settings.lagrange.lr, "commit": code_commit()})

    def log(self, rec: dict) -> None:
        if self.run is not None:
            import mlflow

            mlflow.log_metrics({f"charts/{k}": float(v) for k, v in rec.items()
                                if k != "iter" and isinstance(v, float) and np.isfinite(v)},
                               step=int(rec["iter"]))

    def close(self, best: dict | None) -> None:
        if self.run is not None:
            import mlflow

            if best:
                mlflow.log_metrics({f"best/{k}": float(v) for k, v in best.items()
                                    if isinstance(v, int | float)})
            mlflow.end_run()
