"""Long training runs as Ray jobs: `ragpilot train-reranker --submit` and
`ragpilot train-generator ... --submit` hand their own command line to a cluster's job server
(`ray.job_submission.JobSubmissionClient`, the dashboard's HTTP address, port 8265 by default)
instead of training in the submitting process.

    job = JobRequest(entrypoint="ragpilot train-reranker --set max_items=40",
                     address="http://10.0.0.10:8265", num_cpus=1, num_gpus=1)
    job_id = submit(job)                       # then: ray job logs --follow <job_id>
    status, logs = wait(job.address, job_id)   # optional: until SUCCEEDED/FAILED/STOPPED

The entrypoint's driver reserves `num_cpus` (and `num_gpus` when given) on the node it lands
on, so on KubeRay (head with num-cpus 0) it runs on a worker, and on the GPU group when GPUs are
asked. `working_dir` (default the current directory) is uploaded with the job; its `src` goes
first on PYTHONPATH, so a checkout runs its own code; the environment variables in
FORWARDED_ENV that are set here are passed on (the data, cache and registry paths must name
storage the nodes share).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.errors import ConfigError

DEFAULT_JOB_ADDRESS = "http://127.0.0.1:8265"
EXCLUDES = [".venv", ".git", "runs", "mlruns", ".cache", "bench/results", "__pycache__"]
"""Not uploaded with the working directory (Ray also skips what .gitignore names)."""
FORWARDED_ENV = ("RAGPILOT_DATA", "RAGPILOT_CACHE", "RAGPILOT_MODELS", "MLFLOW_TRACKING_URI",
                 "HF_HOME")
BASE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "RAY_DEDUP_LOGS": "0"}
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def job_address(given: str | None) -> str:
    """The job server's address: `given`, else $RAY_ADDRESS when it is an http(s) URL, else
    DEFAULT_JOB_ADDRESS. ConfigError naming --job-address unless http(s)://HOST[:PORT]."""
    env = os.environ.get("RAY_ADDRESS", "")
    addr = given or (env if env.startswith(("http://", "https://")) else DEFAULT_JOB_ADDRESS)
    rest = addr.split("://", 1)[1] if "://" in addr else ""
    if not addr.startswith(("http://", "https://")) or not rest.strip("/"):
        raise ConfigError("--job-address", f"expected the dashboard URL http://HOST:8265, got "
                                           f"{addr!r}")
    return addr.rstrip("/")


@dataclass
class JobRequest:
    """One `ragpilot` command to run as a Ray job, and what its driver reserves."""

    entrypoint: str
    address: str = DEFAULT_JOB_ADDRESS
    num_cpus: float = 1.0
    """`entrypoint_num_cpus` (> 0)."""
    num_gpus: float | None = None
    """`entrypoint_num_gpus` (> 0), or None: none asked."""
    working_dir: str = "."
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the job (over BASE_ENV and the forwarded ones)."""

    def check(self) -> None:
        """ConfigError naming --cpus, --gpus or --working-dir on a bad value."""
        if not self.num_cpus > 0:
            raise ConfigError("--cpus", f"must be > 0, got {self.num_cpus}")
        if self.num_gpus is not None and not self.num_gpus > 0:
            raise ConfigError("--gpus", f"must be > 0, got {self.num_gpus}")
        if not Path(self.working_dir).is_dir():
            raise ConfigError("--working-dir", f"{self.working_dir} is not a directory")

    def runtime_env(self) -> dict[str, Any]:
        env = {**BASE_ENV, **{k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)},
               "PYTHONPATH": "src", **self.env}
        return {"working_dir": str(Path(self.working_dir).resolve()), "excludes": EXCLUDES,
                "env_vars": env}

    def submit_kwargs(self) -> dict[str, Any]:
        """The keywords of `JobSubmissionClient.submit_job`."""
        kw: dict[str, Any] = {"entrypoint": self.entrypoint, "runtime_env": self.runtime_env(),
                              "entrypoint_num_cpus": self.num_cpus,
                              "metadata": {"submitted_by": "ragpilot"}}
        if self.num_gpus is not None:
            kw["entrypoint_num_gpus"] = self.num_gpus
        return kw


def _client(address: str):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address)


def submit(job: JobRequest) -> str:
    """Submit `job` (checked first); returns the submission id."""
    job.check()
    return _client(job.address).submit_job(**job.submit_kwargs())


def wait(address: str, job_id: str, timeout_s: float | None = None,
         poll_s: float = 1.0) -> tuple[str, str]:
    """Poll the job until it is SUCCEEDED, FAILED or STOPPED (or `timeout_s` passes: the
    status then); returns (status, its logs)."""
    client = _client(address)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        status = str(client.get_job_status(job_id)).rsplit(".", 1)[-1]
        if status in TERMINAL or (deadline is not None and time.monotonic() > deadline):
            return status, client.get_job_logs(job_id)
        time.sleep(poll_s)
