"""Tuner jobs seen from two ingress replicas: the job's state lives in the shared store, so
the replica that did not accept a job still answers `GET /tuner/jobs/{id}` with its status
and, once done, its result (issue 23: ingress replicas >= 2)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from serving.jobs import TunerJobs
from serving.store import open_store


def _poll(jobs: TunerJobs, job_id: str, timeout: float = 10.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        rec = jobs.lookup(job_id)
        if rec is not None and rec["status"] != "running":
            return rec
        time.sleep(0.01)
    raise AssertionError("job did not finish")


def test_a_job_accepted_by_one_replica_is_answered_by_the_other(tmp_path):
    store = open_store(tmp_path / "log.sqlite")
    gate = threading.Event()
    pool = ThreadPoolExecutor(1)

    def work(req: dict) -> dict:
        gate.wait(5)
        return {"reward": 0.25, "k": req["config"]["k"]}

    a = TunerJobs(lambda req: pool.submit(work, req), store=store)
    b = TunerJobs(lambda req: pool.submit(work, req), store=open_store(tmp_path / "log.sqlite"))
    job = a.submit({"config": {"k": 4}})
    assert b.get(job.id) is None  # not in b's memory ...
    seen = b.lookup(job.id)  # ... but in the store
    assert seen["status"] == "running" and seen["request"] == {"config": {"k": 4}}
    gate.set()
    done = _poll(b, job.id)
    assert done["status"] == "done" and done["result"] == {"reward": 0.25, "k": 4}
    assert done["finished"] is not None and done["elapsed_s"] >= 0
    assert b.lookup("no-such-job") is None
    pool.shutdown()


def test_a_failed_job_is_stored_with_its_error_and_rows_are_append_only(tmp_path):
    store = open_store(tmp_path / "log.sqlite")
    fut: Future = Future()
    fut.set_exception(ValueError("split: unknown 'tset'"))
    a = TunerJobs(lambda req: fut, store=store)
    job = a.submit({"split": "tset"})
    rec = TunerJobs(lambda req: fut, store=store).lookup(job.id)
    assert rec["status"] == "failed" and "unknown 'tset'" in rec["error"]
    assert store._read("SELECT COUNT(*) FROM tuner_jobs WHERE job_id = :i", {"i": job.id})[0][0] == 2
    with pytest.raises(Exception, match="append-only"):
        store._write([("DELETE FROM tuner_jobs", {})])


def test_a_store_that_cannot_write_loses_no_job(tmp_path):
    class Broken:
        def save_job(self, *_):
            raise OSError("disk full")

        def get_job(self, _):
            return None

    fut: Future = Future()
    fut.set_result({"reward": 1.0})
    jobs = TunerJobs(lambda req: fut, store=Broken())
    job = jobs.submit({})
    assert jobs.lookup(job.id)["result"] == {"reward": 1.0}  # this replica still answers
