"""`train-reranker` / `train-generator --submit` (issue 23 item 2): the Ray job they submit
(entrypoint = the same command without the job flags, `entrypoint_num_cpus`,
`entrypoint_num_gpus` only when --gpus is given, the working directory in the runtime env) and
the refusals (exit 2 naming the flag). The job client is replaced: no Ray here (the real
submission: tests/test_train_submit.py)."""

from __future__ import annotations

import shlex

import pytest

from serving.cli import main


class FakeClient:
    submitted: list[dict] = []

    def __init__(self, address):
        self.address = address

    def submit_job(self, **kw):
        FakeClient.submitted.append({"address": self.address, **kw})
        return "raysubmit_test123"

    def get_job_status(self, job_id):
        return "JobStatus.SUCCEEDED"

    def get_job_logs(self, job_id):
        return "trained\n"


@pytest.fixture
def client(monkeypatch):
    import rl.common.jobs as jobs

    FakeClient.submitted = []
    monkeypatch.setattr(jobs, "_client", FakeClient)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return FakeClient


def test_reranker_submit_sends_the_command_and_resources(client, tmp_path, capsys):
    rc = main(["train-reranker", "--set", "max_items=40", "--set", "name=tiny",
               "--run-dir", str(tmp_path / "run"), "--submit", "--cpus", "2",
               "--job-address", "http://10.0.0.10:8265", "--working-dir", str(tmp_path)])
    assert rc == 0
    (job,) = client.submitted
    assert job["address"] == "http://10.0.0.10:8265"
    assert shlex.split(job["entrypoint"]) == [
        "ragpilot", "train-reranker", "--set", "max_items=40", "--set", "name=tiny",
        "--run-dir", str(tmp_path / "run")]  # the shipped default --config is not forwarded
    assert job["entrypoint_num_cpus"] == 2.0 and "entrypoint_num_gpus" not in job
    assert job["runtime_env"]["working_dir"] == str(tmp_path.resolve())
    assert job["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "1"
    assert "submitted Ray job raysubmit_test123 to http://10.0.0.10:8265" in \
        capsys.readouterr().out


def test_generator_submit_asks_for_gpus_and_waits(client, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    monkeypatch.chdir(tmp_path)
    rc = main(["train-generator", "dpo", "--out", "/srv/runs/gen", "--model", "/srv/sft",
               "--set", "train.max_steps=20", "--registry", "local", "--submit",
               "--gpus", "1", "--wait"])
    assert rc == 0
    (job,) = client.submitted
    assert job["address"] == "http://head:8265"  # from $RAY_ADDRESS
    assert shlex.split(job["entrypoint"]) == [
        "ragpilot", "train-generator", "dpo", "--set", "train.max_steps=20", "--out",
        "/srv/runs/gen", "--model", "/srv/sft", "--registry", "local"]
    assert job["entrypoint_num_cpus"] == 1.0 and job["entrypoint_num_gpus"] == 1.0
    out = capsys.readouterr().out
    assert "trained" in out and out.rstrip().endswith("job raysubmit_test123: SUCCEEDED")


@pytest.mark.parametrize(("extra", "flag"), [
    (["--submit", "--cpus", "0"], "--cpus"),
    (["--submit", "--gpus", "0"], "--gpus"),
    (["--submit", "--working-dir", "/nonexistent-dir"], "--working-dir"),
    (["--submit", "--job-address", "10.0.0.10:6379"], "--job-address"),
    (["--gpus", "1"], "--gpus"),  # job flags need --submit
    (["--wait"], "--wait"),
])
def test_bad_submit_flags_exit_2_naming_the_flag(client, extra, flag, capsys):
    assert main(["train-reranker", "--set", "max_items=1", *extra]) == 2
    assert f"error: {flag}:" in capsys.readouterr().err
    assert client.submitted == []


def test_registry_flag_names_the_local_registry(tmp_path):
    from rag.models import local_registry_path
    from serving.cli.train import registry_file

    assert registry_file(None) is None
    assert registry_file("local") == local_registry_path()
    assert registry_file(str(tmp_path / "r.yaml")) == tmp_path / "r.yaml"


@pytest.mark.parametrize("argv, flag", [
    (["sft", "--grpo-set", "steps=3"], "--grpo-set"),       # silently dropped before
    (["dpo", "--grpo-set", "steps=3"], "--grpo-set"),
    (["sft", "--model", "runs/x/merged"], "--model"),       # sft trains base_model
    (["dpo", "--model", "a", "--policy", "b"], "--policy"),  # the old name and the new
    (["sft", "--no-merge", "--registry", "local"], "--registry"),
])
def test_generator_flags_that_do_nothing_are_refused_before_a_job_is_sent(
        client, tmp_path, argv, flag, capsys):
    out = tmp_path / "run"
    assert main(["train-generator", *argv, "--out", str(out), "--submit"]) == 2
    assert f"error: {flag}:" in capsys.readouterr().err
    assert client.submitted == [] and not out.exists()


@pytest.mark.parametrize("make, says", [
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_text("models: [1, 2\n"), "not valid YAML"),
    (lambda p: p.write_text("- a list\n"), "must be a mapping"),
])
def test_a_bad_registry_is_refused_before_training(tmp_path, make, says, capsys):
    reg = tmp_path / "registry.yaml"
    make(reg)
    out = tmp_path / "run"
    assert main(["train-generator", "sft", "--out", str(out), "--registry", str(reg)]) == 2
    err = capsys.readouterr().err
    assert "error: --registry:" in err and says in err and not out.exists()


def test_generator_policy_flag_is_the_deprecated_name_of_model(client, monkeypatch, capsys):
    """`--policy` still works for one release: a one-line notice on stderr, and the job runs
    with `--model`."""
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    assert main(["train-generator", "dpo", "--out", "/srv/runs/gen", "--policy", "/srv/sft",
                 "--submit"]) == 0
    (job,) = client.submitted
    argv = shlex.split(job["entrypoint"])
    assert argv[argv.index("--model") + 1] == "/srv/sft" and "--policy" not in argv
    err = [line for line in capsys.readouterr().err.splitlines() if "deprecated" in line]
    assert len(err) == 1 and "--model" in err[0]
