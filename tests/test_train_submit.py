"""`ragpilot train-reranker --submit` (issue 23 item 2) against a real Ray head and its job
server on this machine: tests/support/job_submit.py starts `ray start --head
--include-dashboard=true` (1 CPU) in a private network namespace, submits a tiny training
(2 items, a 1-layer random BERT, 1 step) with `--submit --cpus 1 --wait`, and reports. Checked:
the CLI printed the job id, the job SUCCEEDED, its log is the training's output and names the
trained model, and the model is in the registry the job wrote (the job's RAGPILOT_CACHE,
forwarded from the submitter). The head is always stopped by its process group."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.support.ray_cluster import netns_command, netns_script_report

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 150


@pytest.fixture
def report():
    if netns_command(["true"]) is None:
        pytest.skip("no private network namespace here (unshare -n / ip link)")
    with netns_script_report(REPO / "tests" / "support" / "job_submit.py", "rj-", TIMEOUT_S,
                             logs_key="head_log") as data:
        yield data


def test_train_reranker_runs_as_a_ray_job(report):
    from tests.support.job_submit import MODEL_NAME

    out = report["stdout"]
    assert report["rc"] == 0
    m = re.search(r"^submitted Ray job (\S+) to http://127\.0\.0\.1:\d+: ragpilot "
                  r"train-reranker .*--run-dir ", out, re.M)
    assert m, out
    job_id = m.group(1)
    assert "--submit" not in out.split("\n")[0]  # the job trains; it does not resubmit
    assert f"Running entrypoint for job {job_id}" in out
    assert "step 1/1 loss" in out  # the training's own log
    assert f'"version": "{MODEL_NAME}@v1"' in out  # the log names the trained model
    assert out.rstrip().endswith(f"job {job_id}: SUCCEEDED")
    assert f"{MODEL_NAME}@v1" in report["registry"]
    assert report["job_s"] < TIMEOUT_S
