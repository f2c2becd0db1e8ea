"""Asynchronous tuner evaluations behind `POST /tuner/evaluate` and `GET /tuner/jobs/{id}`.

A job runs `rl.tuner.run.evaluate_request` (`rl.kernel.evaluator.evaluate(config, dataset,
split, batch_size, seed)`) somewhere else than the ingress's event loop: `submit` is any callable returning a `concurrent.futures.Future`
(the app passes a Ray task's `ObjectRef.future()`, so evaluations run in a worker process;
tests pass a thread pool). Jobs live in memory (the newest `max_jobs` are kept) and, given a
`store` (`serving.store.InteractionStore`), every state change is also appended there, so any
ingress replica answers for a job another replica took (`lookup`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

Submit = Callable[[dict[str, Any]], Future]
log = logging.getLogger(__name__)


def run_evaluation(request: dict[str, Any]) -> dict[str, Any]:
    """The job body: `rl.tuner.run.evaluate_request` (one `rl.kernel.evaluator.evaluate` call)
    -> its report as JSON."""
    from rl.tuner.run import evaluate_request

    return evaluate_request(request)


@dataclass
class Job:
    id: str
    request: dict[str, Any]
    submitted: float = field(default_factory=time.time)
    finished: float | None = None
    status: str = "running"
    """running | done | failed."""
    result: dict[str, Any] | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        elapsed = (self.finished or time.time()) - self.submitted
        return {"job_id": self.id, "status": self.status, "request": self.request,
                "submitted": self.submitted, "finished": self.finished,
                "elapsed_s": round(elapsed, 3), "result": self.result, "error": self.error}


class TunerJobs:
    """Submits evaluation jobs and tracks them; `on_done(job)` runs when one finishes."""

    def __init__(self, submit: Submit, max_jobs: int = 256,
                 on_done: Callable[[Job], None] | None = None, store: Any = None):
        self._submit = submit
        self.store = store
        self.max_jobs = max_jobs
        self.on_done = on_done
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()

    def submit(self, request: dict[str, Any]) -> Job:
        job = Job(uuid.uuid4().hex, request)
        with self._lock:
            self._jobs[job.id] = job
            while len(self._jobs) > self.max_jobs:
                oldest = next((k for k, j in self._jobs.items() if j.status != "running"),
                              None)
                if oldest is None:
                    break
                del self._jobs[oldest]
        self._persist(job)
        try:
            fut = self._submit(request)
        except Exception as exc:  # the runner itself failed: the job fails, the API answers
            self._finish(job, None, exc)
            return job
        fut.add_done_callback(lambda f: self._finish(job, f, None))
        return job

    def _finish(self, job: Job, fut: Future | None, exc: BaseException | None) -> None:
        if fut is not None:
            exc = fut.exception()
        with self._lock:
            job.finished = time.time()
            if exc is None and fut is not None:
                job.status, job.result = "done", fut.result()
            else:
                job.status, job.error = "failed", _describe(exc)
        self._persist(job)
        if self.on_done:
            with contextlib.suppress(Exception):  # a hook must never lose the job's result
                self.on_done(job)

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def lookup(self, job_id: str) -> dict[str, Any] | None:
        """The job as `Job.to_dict()`: from this process, else the newest state in the store
        (a job another ingress replica took; a running one's `elapsed_s` counts to now)."""
        job = self.get(job_id)
        if job is not None:
            return job.to_dict()
        rec = self.store.get_job(job_id) if self.store is not None else None
        if rec is not None and rec.get("status") == "running":
            rec["elapsed_s"] = round(time.time() - float(rec["submitted"]), 3)
        return rec

    def _persist(self, job: Job) -> None:
        if self.store is None:
            return
        try:
            self.store.save_job(job.id, job.to_dict())
        except Exception as exc:  # the job itself goes on; only other replicas lose sight of it
            log.warning("tuner job %s: state not stored (%s); only this replica can answer "
                        "for it", job.id, exc)

    def counts(self) -> dict[str, int]:
        with self._lock:
            out: dict[str, int] = {}
            for j in self._jobs.values():
                out[j.status] = out.get(j.status, 0) + 1
            return out


def _describe(exc: BaseException | None) -> str:
    """The innermost message (Ray wraps task errors; the user wants `split: unknown ...`)."""
    if exc is None:
        return "unknown error"
    cause = getattr(exc, "cause", None) or exc.__cause__
    if isinstance(cause, BaseException) and cause is not exc:
        return _describe(cause)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"
