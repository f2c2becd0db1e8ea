"""Handlers of the ingress's tuner routes (declared on serving.app.Ingress): `POST
/tuner/evaluate` submits an evaluation job (`rl.tuner.run.evaluate_request` in a Ray task:
serving.jobs) and `GET /tuner/jobs/{id}` polls it.

`TunerRoutes` is a mixin of `serving.app.Ingress` and uses its settings, jobs, gates and metrics.
"""

from __future__ import annotations

from typing import Any

from serving.jobs import Job, run_evaluation
from serving.schemas import ApiError, EvaluateRequest


class TunerRoutes:
    """/tuner/evaluate and /tuner/jobs/{id} (a mixin of serving.app.Ingress)."""

    def _submit_eval(self, request: dict[str, Any]):
        import ray

        task = ray.remote(run_evaluation).options(num_cpus=self.settings.eval_num_cpus,
                                                  max_retries=0)
        return task.remote(request).future()

    def _job_done(self, job: Job) -> None:
        self.metrics.jobs.labels(job.status).inc()
        if job.result:
            self.gates[job.result["config_hash"]] = job.result["gates"]
            self.metrics.set_gates(job.result["config_hash"], job.result["gates"])

    async def _tuner_evaluate(self, body: EvaluateRequest) -> dict[str, Any]:
        cap = self.settings.limits.max_batch_size
        if body.batch_size is not None and body.batch_size > cap:
            raise ApiError("batch_size", f"is {body.batch_size}; the limit is {cap} "
                                         "(limits.max_batch_size)")
        if not self.settings.allows_eval(body.dataset):
            raise ApiError("dataset", f"{body.dataset!r} is not one this server evaluates: "
                                      "add it to serve.eval_datasets (a name, file or folder)",
                           403)
        from rag.corpus.hygiene import SPLIT_NAMES

        if body.split is not None and body.split not in SPLIT_NAMES:  # else a failed job
            raise ApiError("split", f"unknown split {body.split!r}: one of "
                                    f"{', '.join(SPLIT_NAMES)} (or leave it out: the tuner's "
                                    "split)")
        cfg = self._limited_config(body.config, "config")
        job = self.jobs.submit({"config": cfg.model_dump(mode="json"), "dataset": body.dataset,
                                "split": body.split, "batch_size": body.batch_size,
                                "seed": body.seed,
                                "allow_missing_gold": body.allow_missing_gold})
        return {"job_id": job.id, "status": job.status, "variant_id": cfg.config_hash,
                "poll": f"/tuner/jobs/{job.id}"}

    async def _tuner_job(self, job_id: str) -> dict[str, Any]:
        job = self.jobs.lookup(job_id)  # this replica's, else the store's (another replica)
        if job is None:
            raise ApiError("job_id", f"unknown job {job_id!r}", 404)
        return job

