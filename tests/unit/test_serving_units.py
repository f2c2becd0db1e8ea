"""Rate limiter, in-flight gate, Prometheus metrics, tuner jobs and settings (no Ray)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rag.errors import ConfigError
from serving.jobs import TunerJobs
from serving.limits import InflightGate, TokenBucketLimiter, retry_after_header
from serving.metrics import ServeMetrics
from serving.schemas import ServeSettings


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket_refills_per_client():
    clock = Clock()
    lim = TokenBucketLimiter(rate=2.0, burst=3, clock=clock)
    assert [lim.acquire("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert lim.acquire("a") == pytest.approx(0.5)  # one token at 2/s
    assert lim.acquire("b") == 0.0  # other clients are not affected
    clock.t += 0.5
    assert lim.acquire("a") == 0.0 and lim.acquire("a") > 0
    clock.t += 100
    assert [lim.acquire("a") for _ in range(4)][-1] > 0  # refill capped at burst


def test_token_bucket_forgets_least_recent_clients():
    lim = TokenBucketLimiter(rate=1.0, burst=1, max_clients=2, clock=Clock())
    lim.acquire("a")
    lim.acquire("b")
    lim.acquire("c")
    assert len(lim) == 2 and lim.acquire("a") == 0.0  # "a" was evicted: full bucket again


def test_inflight_gate_and_retry_after():
    g = InflightGate(2)
    assert g.try_enter() and g.try_enter() and not g.try_enter()
    g.leave()
    assert g.try_enter() and g.peak == 2
    assert retry_after_header(0.01) == "1" and retry_after_header(1.2) == "2"
    with pytest.raises(ValueError):
        InflightGate(0)


def test_metrics_bounded_labels_and_deltas():
    m = ServeMetrics(max_variants=2)
    lat = {"retrieve": 10.0, "generate": 2.0, "pipeline": 13.0, "total": 15.0, "weird": 1.0}
    m.observe_answer("stable1", "stable", lat, 100, 5, f1=0.5)
    m.observe_answer("canary1", "canary", {**lat, "total": 25.0}, 100, 5, f1=0.75)
    m.observe_answer("third", "canary", lat, 100, 5)
    m.observe_feedback("stable1", "stable", 0.4)
    m.observe_feedback("canary1", "canary", 0.9)
    m.observe_shadow(13.0, 20.0, 0.5, 0.25)
    m.set_gates("canary1", {"faithfulness": True, "p95_latency_ms": False})
    m.set_traffic(10.0, 5.0)
    m.request("query", 200)
    m.request("feedback", 404)
    m.request("/weird", 500)
    text = m.render()[0].decode()
    assert 'variant="other"' in text and 'variant="third"' not in text
    assert 'stage="weird"' not in text
    assert 'ragpilot_canary_delta{metric="f1"} 0.25' in text  # "third" has no gold F1
    assert 'ragpilot_canary_delta{metric="reward"} 0.5' in text
    assert 'ragpilot_shadow_delta{metric="latency_ms"} 7.0' in text
    assert 'ragpilot_shadow_delta{metric="f1"} -0.25' in text
    assert 'ragpilot_gate_status{gate="p95_latency_ms",variant="canary1"} 0.0' in text
    assert 'ragpilot_errors_total{endpoint="feedback",kind="404"} 1.0' in text
    assert 'ragpilot_errors_total{endpoint="other",kind="500"} 1.0' in text
    assert 'ragpilot_tokens_total{direction="in",variant="stable1"} 100.0' in text
    assert "ragpilot_stage_latency_seconds_bucket" in text


def _wait(jobs: TunerJobs, job_id: str, timeout: float = 10.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        j = jobs.get(job_id)
        if j.status != "running":
            return j.to_dict()
        time.sleep(0.01)
    raise AssertionError("job did not finish")


def test_tuner_jobs_run_in_background_and_report_errors():
    done = []
    pool = ThreadPoolExecutor(2)

    def work(req: dict) -> dict:
        if req["config"].get("k") == 0:
            raise ConfigError("rag.k", "Input should be greater than or equal to 1")
        time.sleep(0.05)
        return {"reward": 0.5, **req}

    jobs = TunerJobs(lambda req: pool.submit(work, req), max_jobs=2, on_done=done.append)
    ok = jobs.submit({"config": {"k": 5}})
    assert jobs.get(ok.id).status == "running"  # submit returns at once
    bad = jobs.submit({"config": {"k": 0}})
    assert _wait(jobs, ok.id)["result"]["reward"] == 0.5
    err = _wait(jobs, bad.id)
    assert err["status"] == "failed" and "rag.k" in err["error"]
    assert len(done) == 2
    third = jobs.submit({"config": {"k": 3}})
    _wait(jobs, third.id)
    assert jobs.get(ok.id) is None and jobs.counts() == {"failed": 1, "done": 1}
    broken = TunerJobs(lambda req: (_ for _ in ()).throw(RuntimeError("no cluster")))
    assert broken.submit({}).status == "failed"
    pool.shutdown()


def test_settings_validate_and_name_the_key():
    s = ServeSettings.from_args({"canary": {"variant": "bm25"}, "traffic": {"canary_percent": 5}})
    assert s.config(s.canary).variant == "bm25" and s.config(s.stable).generator == "extractive"
    for args, field in [({"colour": 1}, "serve.colour"),
                        ({"canary": {"k": 0}}, "serve.canary.k"),
                        ({"traffic": {"canary_percent": 101}}, "serve.traffic.canary_percent"),
                        ({"bandit": {"arms": [{"nope": 1}]}}, "serve.bandit.arms.0.nope"),
                        ({"indexes": {"faiss_device": "tpu"}}, "serve.indexes.faiss_device"),
                        ({"indexes": {"dense": "faiss", "bogus": 1}}, "serve.indexes.bogus")]:
        with pytest.raises(ConfigError) as e:
            ServeSettings.from_args(args)
        assert e.value.field == field, (args, e.value)


def test_tuner_evaluate_reads_only_allowed_datasets(tmp_path, monkeypatch):
    """`POST /tuner/evaluate` names a dataset the server then reads: only built-in names,
    `serve.eval_datasets` entries (a folder allows what lies under it, not beside it, and not
    through `..` or a link) and the served `dataset` are allowed."""
    monkeypatch.chdir(tmp_path)
    mine, other = tmp_path / "data" / "mine", tmp_path / "data" / "other"
    for d in (mine, other):
        d.mkdir(parents=True)
        (d / "corpus.jsonl").write_text("{}\n")
    (mine / "escape").symlink_to(other)
    default = ServeSettings.from_args(None)
    assert all(default.allows_eval(n) for n in ("synthetic", "hotpotqa", "scifact", "mtrag"))
    for refused in ("/etc/passwd", str(mine), "data/mine/corpus.jsonl", "no-such-dataset"):
        assert not default.allows_eval(refused), refused
    s = ServeSettings.from_args({"eval_datasets": ["synthetic", "data/mine"]})
    assert s.allows_eval("synthetic") and not s.allows_eval("hotpotqa")
    assert s.allows_eval(str(mine)) and s.allows_eval("data/mine/corpus.jsonl")
    assert s.allows_eval(str(mine / "new.jsonl"))  # not there yet: the job names it missing
    for refused in (str(other / "corpus.jsonl"), "data/mine/../other/corpus.jsonl",
                    str(mine / "escape" / "corpus.jsonl"), "data/mine-2", "/etc/passwd"):
        assert not s.allows_eval(refused), refused
    served = ServeSettings.from_args({"dataset": "data/other/corpus.jsonl", "eval_datasets": []})
    assert served.allows_eval(str(other / "corpus.jsonl")) and not served.allows_eval("synthetic")
    assert not served.allows_eval(str(other))  # a file entry allows that file only
    with pytest.raises(ConfigError) as e:
        ServeSettings.from_args({"eval_datasets": "synthetic"})
    assert e.value.field == "serve.eval_datasets"


def test_serve_indexes_section_reaches_every_replica(tmp_path, monkeypatch):
    """`args.indexes` (where index backends run) is validated at load and passed to every
    pipeline the app builds, the local in-process path included."""
    import serving.app as app_mod
    import serving.pipelines as pipelines_mod

    seen = []

    class FakeService:  # stands in for PipelineService: records what a replica would open
        def __init__(self, config, dataset, index_dir, indexes=None):
            seen.append(indexes)

        def answer(self, question, query_id="q"):
            return {}

        def info(self):
            return {}

    monkeypatch.setattr(pipelines_mod, "PipelineService", FakeService)
    args = {"store_url": str(tmp_path / "x.sqlite"), "indexes": {"faiss_device": "cpu"},
            "canary": {"variant": "bm25"}}
    assert ServeSettings.from_args(args).indexes == {"faiss_device": "cpu"}
    app_mod.local_app(args)
    assert len(seen) == 2 and all(i == {"faiss_device": "cpu"} for i in seen)
    bound = []
    monkeypatch.setattr(app_mod, "bind_shared",
                        lambda ds, idx, opts, indexes, n, warm: bound.append(indexes))
    # the Ray Serve graph: the one shared pipeline deployment (serving every variant, both
    # configs here) gets the overrides
    app_mod.build_app(args)
    assert bound == [{"faiss_device": "cpu"}]


def test_build_app_checks_the_variant_budget(tmp_path):
    from serving.app import build_app

    app = build_app({"store_url": str(tmp_path / "x.sqlite"), "canary": {"variant": "bm25"}})
    assert app is not None
    with pytest.raises(ConfigError, match="max_variants"):
        build_app({"max_variants": 1, "canary": {"variant": "bm25"}})


def test_default_yaml_builds_and_stays_on_loopback(tmp_path):
    from serving.app import build_app
    from serving.launch import read_serve_yaml

    http, apps = read_serve_yaml("configs/serve/default.yaml")
    assert http["host"] == "127.0.0.1"
    args = {**apps[0]["args"], "store_url": str(tmp_path / "s.sqlite")}
    s = ServeSettings.from_args(args)
    assert s.pipelines.autoscaling["max_replicas"] >= 1 and s.traffic.canary_percent == 10.0
    assert build_app(args) is not None
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications:\n  - import_path: other.module:app\n")
    with pytest.raises(ConfigError, match="applications.0.import_path"):
        read_serve_yaml(bad)


def test_cli_exports_interactions(tmp_path, capsys):
    from serving.cli import main
    from serving.store import Interaction, open_store

    store = open_store(tmp_path / "log.sqlite")
    store.log_interaction(Interaction("i1", "q?", "v", "stable", 1.0, "a"))
    store.log_interaction(Interaction("i2", "q?", "w", "shadow", 0.1, "b", shadow=True,
                                      parent_id="i1"))
    store.add_feedback("i1", 0.5)
    store.close()
    out = tmp_path / "train.jsonl"
    assert main(["export-interactions", "--store", str(tmp_path / "log.sqlite"), "--out",
                 str(out), "--no-shadow"]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and '"reward": 0.5' in lines[0]
    # a reader never makes a store: a mistyped path is exit 2 naming it, not "wrote 0"
    capsys.readouterr()
    (tmp_path / "text.sqlite").write_text("not a database")
    import sqlite3

    sqlite3.connect(tmp_path / "other.sqlite").execute("CREATE TABLE t (x)")
    for given, message in [(tmp_path / "typo.sqlite", "no interaction store at"),
                           (f"sqlite:///{tmp_path / 'typo2.sqlite'}", "no interaction store at"),
                           (tmp_path / "text.sqlite", "is not an SQLite database"),
                           (tmp_path / "other.sqlite", "without an interactions table")]:
        assert main(["export-interactions", "--store", str(given), "--out",
                     str(tmp_path / "x.jsonl")]) == 2, given
        assert "error: --store: " in (err := capsys.readouterr().err) and message in err, err
    assert not (tmp_path / "typo.sqlite").exists() and not (tmp_path / "typo2.sqlite").exists()
    assert not (tmp_path / "x.jsonl").exists()
    assert main(["serve", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_export_never_harms_the_store_or_leaves_half_a_file(tmp_path, capsys):
    """--out that is the store (it was truncated to 0 bytes: an audit found it), a folder, and
    a row the export cannot decode: exit 2 naming the problem, the store and an earlier
    export unchanged, no partial file."""
    import sqlite3

    from serving.cli import main
    from serving.store import Interaction, open_store

    db = tmp_path / "log.sqlite"
    store = open_store(db)
    store.log_interaction(Interaction("i1", "q?", "v", "stable", 1.0, "a"))
    store.log_interaction(Interaction("i2", "q?", "v", "stable", 1.0, "b"))
    store.close()
    size = db.stat().st_size
    for out, message in [(db, "is the store itself"), (tmp_path, "is a directory")]:
        assert main(["export-interactions", "--store", str(db), "--out", str(out)]) == 2
        assert "error: --out: " in (err := capsys.readouterr().err) and message in err, err
    assert db.stat().st_size == size
    out = tmp_path / "train.jsonl"
    assert main(["export-interactions", "--store", str(db), "--out", str(out)]) == 0
    before = out.read_text()
    with sqlite3.connect(db) as con:  # a row written by something else (the log is append-only)
        con.execute("INSERT INTO interactions (id, ts, question, category, variant_id, route, "
                    "propensity, features, context_ids, citations, answer, latency_ms, "
                    "tokens_in, tokens_out, shadow) VALUES ('i3', 9e9, 'q', 'default', 'v', "
                    "'stable', 1.0, '{}', '[]', '[]', 'c', '{bad', 1, 1, 0)")
    assert main(["export-interactions", "--store", str(db), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "interactions.latency_ms" in err and "'i3'" in err, err
    assert out.read_text() == before and not list(tmp_path.glob(".train.jsonl*"))


def test_pii_leak_penalty_of_the_reward_by_hand():
    """rl.kernel.reward: P gains w_pii x mean leaks per query; one row's reward loses w_pii per leak
    (clipped to [0, 1]); no leaks change nothing."""
    from rl.kernel.reward import (
        PII_LEAK_WEIGHT,
        StepMetrics,
        feedback_reward,
        gates,
        penalty,
        reward,
    )
    from rl.kernel.settings import TunerSettings

    p = TunerSettings()
    t = p.thresholds.model_copy(update={"relevancy": 0.5})
    m = StepMetrics(faithfulness=0.8, relevancy=0.6, p95_latency_ms=250, cost=500)
    assert PII_LEAK_WEIGHT == 1.0
    assert reward(m, p.reward_weights, t, 1000, 0.05)[0] == pytest.approx(0.5)  # as before
    leaky = StepMetrics(0.8, 0.6, 250, 500, pii_leaks=0.2)
    # 0.5*0.8 + 0.5*0.6 - 0.2*0.5 - 0.2*0.5 - 1.0*(0 gates + 1.0*0.2) = 0.3
    assert reward(leaky, p.reward_weights, t, 1000, 0.05)[0] == pytest.approx(0.3)
    assert reward(leaky, p.reward_weights, t, 1000, 0.05, pii_weight=0.5)[0] == \
        pytest.approx(0.4)
    v = gates(m, p.thresholds, 0.05)  # relevancy fails: 1
    assert penalty(v) == 1.0 and penalty(v, 2.0) == 3.0 and penalty(v, 2.0, 0.25) == 1.5
    assert feedback_reward(0.9) == 0.9 and feedback_reward(0.9, 0) == 0.9
    assert feedback_reward(0.9, 1) == 0.0 and feedback_reward(0.9, 1, 0.25) == pytest.approx(0.65)
    assert feedback_reward(0.3, 2, 0.25) == 0.0  # clipped at 0
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="pii_leaks"):
            feedback_reward(0.5, bad)


def test_rollout_log_evidence_carries_the_pii_penalty():
    """Interaction rows used as rollout evidence: reward (and scores[reward_key]) lose the
    penalty per leak; rows without leaks are untouched."""
    from rl.promotion.evidence import penalize_pii

    rows = [{"id": "a", "reward": 0.8, "scores": {"f1": 0.9, "pii_leaks": 0.0}},
            {"id": "b", "reward": 0.8, "scores": {"f1": 0.9, "pii_leaks": 2.0}},
            {"id": "c", "reward": None, "scores": {"f1": 0.9, "pii_leaks": 1.0}},
            {"id": "d", "reward": 0.7, "scores": None}]
    out = penalize_pii(rows, reward_key="f1", weight=0.25)
    assert out[0] is rows[0] and out[3] is rows[3]
    assert out[1]["reward"] == pytest.approx(0.3) and out[1]["scores"]["f1"] == pytest.approx(0.4)
    assert out[2]["reward"] is None and out[2]["scores"]["f1"] == pytest.approx(0.65)
    assert rows[1]["reward"] == 0.8  # the input is not modified
    assert penalize_pii(rows)[1]["reward"] == 0.0  # default weight 1.0
    assert penalize_pii(rows, weight=0)[1] is rows[1]
    with pytest.raises(ConfigError, match="pii_penalty"):  # `--pii-penalty` in the CLI
        penalize_pii(rows, weight=-1)


def test_serving_ops_files_name_tests_that_exist():
    """Comments in the Prometheus config, the runbooks and docs/serving.md point at tests that
    exist (deploy/prometheus/prometheus.yml once named a test file that never did)."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    files = [repo / "deploy/prometheus/prometheus.yml", repo / "docs/serving.md",
             *sorted((repo / "runbooks").glob("*.md"))]
    named = {m for f in files for m in re.findall(r"tests/(?:unit/)?test_\w+\.py", f.read_text())}
    assert "tests/test_serving_prometheus.py" in named
    assert sorted(n for n in named if not (repo / n).exists()) == []


def test_serve_access_log_is_a_setting_off_by_default():
    """Ray Serve's per-request access lines (proxy and replicas) follow `access_log`; the
    interaction log and Prometheus already record every request."""
    from serving.launch import _access_log
    from serving.schemas import ServeSettings

    assert ServeSettings.from_args(None).access_log is False
    assert _access_log(None) is False and _access_log({"access_log": True}) is True


def test_fast_query_encoding_switches_only_inside_a_serve_replica():
    """Tests and in-process callers keep the process-wide query runtime; a Serve replica
    (replica context set) switches its one-question encodes to ONNX Runtime fp32."""
    from rag import encoders
    from serving.pipelines import fast_queries_in_replica

    before = encoders._QUERY_RUNTIME["mode"]
    assert fast_queries_in_replica() is False
    assert encoders._QUERY_RUNTIME["mode"] == before


def test_proxy_choice_defaults_env_and_typed_errors(monkeypatch):
    """serving.launch.resolve_proxy: argument > $RAGPILOT_SERVE_PROXY > Ray's own switch >
    `serve`; a bad value is a ConfigError naming where it came from."""
    from serving.launch import PROXY_ENV, resolve_proxy

    monkeypatch.delenv(PROXY_ENV, raising=False)
    monkeypatch.delenv("RAY_SERVE_ENABLE_HA_PROXY", raising=False)
    assert resolve_proxy(None) == "serve"
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1")
    assert resolve_proxy(None) == "haproxy"
    monkeypatch.setenv(PROXY_ENV, "serve")
    assert resolve_proxy(None) == "serve"
    assert resolve_proxy("haproxy") == "haproxy"
    with pytest.raises(ConfigError) as e:
        resolve_proxy("nginx")
    assert e.value.field == "proxy" and "nginx" in e.value.message
    monkeypatch.setenv(PROXY_ENV, "envoy")
    with pytest.raises(ConfigError) as e:
        resolve_proxy(None)
    assert e.value.field == PROXY_ENV


def test_haproxy_mode_needs_the_binary_and_a_short_socket_path(monkeypatch, tmp_path):
    """Without haproxy, HAProxy mode is a typed error that says how to install it; with one,
    HAProxy's files go to a directory of their own whose admin socket path (Serve adds a
    56-character subdirectory) stays within HAProxy's 97-character limit."""
    from serving import launch

    monkeypatch.setattr(launch, "_SET_ENV", {})
    monkeypatch.setattr(launch, "_RUN_DIRS", [])
    for var in ("RAY_SERVE_HAPROXY_BINARY_PATH", "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC",
                "RAY_SERVE_HAPROXY_SOCKET_PATH", "RAY_SERVE_HAPROXY_SERVER_STATE_BASE",
                "RAY_SERVE_HAPROXY_SERVER_STATE_FILE", "RAY_SERVE_ENABLE_HA_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(launch.shutil, "which", lambda *a, **k: None)
    with pytest.raises(ConfigError) as e:
        launch._haproxy_env()
    assert e.value.field == "proxy" and "apt-get install haproxy" in e.value.message
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ
    fake = tmp_path / "haproxy"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", str(fake))
    launch._haproxy_env()
    assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    sock = os.environ["RAY_SERVE_HAPROXY_SOCKET_PATH"]
    run_dir = os.path.dirname(sock)
    assert os.path.dirname(os.environ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"]) == run_dir
    assert len(os.path.join(run_dir, "x" * 56, os.path.basename(sock))) <= 97
    # stop_local puts the environment back and removes the directory, so the next cluster
    # this process starts chooses its proxy afresh (Ray is not running here: nothing to stop)
    monkeypatch.delenv(launch.DRAIN_ENV, raising=False)
    launch._set_env(launch.DRAIN_ENV, launch.LOCAL_DRAIN_S, overwrite=False)  # as start_local
    import ray
    from ray import serve

    def not_here(*a, **k):  # serve.shutdown() without a cluster starts one to find nothing
        raise AssertionError("stop_local touched Ray although none was running")

    # no Ray in this process as far as stop_local can tell (an earlier test's runtime, if any,
    # is neither seen nor shut down here)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    for mod, name in ((ray, "init"), (ray, "shutdown"), (serve, "shutdown")):
        monkeypatch.setattr(mod, name, not_here)
    launch.stop_local()
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ
    assert launch.DRAIN_ENV not in os.environ
    assert os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"] == str(fake)  # the caller's own value
    assert "RAY_SERVE_HAPROXY_SOCKET_PATH" not in os.environ
    assert not os.path.exists(run_dir)
    assert launch.resolve_proxy(None) == "serve"


def test_free_port_avoids_the_ephemeral_range_and_ports_in_use(monkeypatch):
    """free_port's ports come from FREE_PORTS, not from the kernel's ephemeral range where Ray's
    own outgoing connections take their local ports; a port in use is skipped."""
    import random
    import socket

    from serving import netns

    lo, hi = netns.FREE_PORTS
    from pathlib import Path

    eph = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    eph_lo, eph_hi = int(eph[0]), int(eph[1])
    assert hi < eph_lo or lo > eph_hi  # disjoint from this machine's ephemeral range
    ports = {netns.free_port() for _ in range(20)}
    assert all(lo <= p <= hi for p in ports) and len(ports) > 1
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken, free = busy.getsockname()[1], netns.free_port()
        draws = iter([taken, free])
        monkeypatch.setattr(random.Random, "randint", lambda self, a, b: next(draws))
        assert netns.free_port() == free


def test_start_local_starts_its_cluster_with_the_local_cluster_env_and_puts_it_back(
        monkeypatch):
    """Ray workers at niceness 15 and a 5 s proxy readiness check failed `make demo`'s serve
    stage beside a busy benchmark (rl.common.runtime.LOCAL_CLUSTER_ENV). A cluster start_local
    starts sees LOCAL_CLUSTER_ENV, except a variable the caller set; stop_local puts the
    environment back. Ray itself is replaced here: what is checked is the environment Ray
    would be started with."""
    import ray
    from ray import serve

    import serving.app
    from rl.common.runtime import LOCAL_CLUSTER_ENV, SERVE_PROXY_READY_ENV, WORKER_NICENESS_ENV
    from serving import launch

    seen = []
    for var in (*LOCAL_CLUSTER_ENV, launch.PROXY_ENV, launch.HAPROXY_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **k: seen.append(
        {v: os.environ.get(v) for v in LOCAL_CLUSTER_ENV}))
    monkeypatch.setattr(serve, "start", lambda **k: None)
    monkeypatch.setattr(serve, "run", lambda *a, **k: None)
    monkeypatch.setattr(serving.app, "build_app", lambda args: None)
    assert launch.start_local(port=8123) == "http://127.0.0.1:8123"
    assert seen == [{SERVE_PROXY_READY_ENV: "30", WORKER_NICENESS_ENV: "0"}]
    assert float(LOCAL_CLUSTER_ENV[SERVE_PROXY_READY_ENV]) < 60  # under serve.start's wait
    launch.stop_local()
    assert not set(LOCAL_CLUSTER_ENV) & set(os.environ)
    monkeypatch.setenv(SERVE_PROXY_READY_ENV, "7")
    launch.start_local(port=8123)
    assert seen[-1] == {SERVE_PROXY_READY_ENV: "7", WORKER_NICENESS_ENV: "0"}
    launch.stop_local()
    assert os.environ[SERVE_PROXY_READY_ENV] == "7" and WORKER_NICENESS_ENV not in os.environ


def test_the_control_planes_local_cluster_gets_the_same_env(monkeypatch):
    """`make demo` starts Ray for Tune (rl.common.runtime.init_ray) before Serve runs on that
    cluster, so init_ray sets LOCAL_CLUSTER_ENV too (unless the user has; not on a cluster it
    joins, whose environment is its own)."""
    import ray

    from rl.common import runtime

    seen = []
    for var in runtime.LOCAL_CLUSTER_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **k: seen.append(
        (k.get("address"), {v: os.environ.get(v) for v in runtime.LOCAL_CLUSTER_ENV})))
    runtime.init_ray(num_cpus=1)
    assert seen == [(None, runtime.LOCAL_CLUSTER_ENV)]
    monkeypatch.setenv(runtime.WORKER_NICENESS_ENV, "5")
    runtime.init_ray(num_cpus=1)
    assert seen[-1][1][runtime.WORKER_NICENESS_ENV] == "5"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    for var in runtime.LOCAL_CLUSTER_ENV:
        monkeypatch.delenv(var, raising=False)
    runtime.init_ray()
    assert seen[-1] == ("127.0.0.1:6379", {v: None for v in runtime.LOCAL_CLUSTER_ENV})
