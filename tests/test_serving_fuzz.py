"""Schemathesis fuzzing of the Serve app's OpenAPI spec: >= 1,000 generated requests (valid
and invalid by the schema), none may get a 5xx.

The ingress runs in-process as an ASGI app (`serving.app.local_app`: every route, the API-key
and body-size middleware, the real SQLite store) with the real `PipelineService` of the default
config answering /query; variants deployed at run time by /admin/traffic and tuner jobs are
stand-ins (test_serving_app.py runs both for real under Ray Serve). Requests carry an admin key
so the admin handlers are fuzzed too, not only the 401 in front of them.
"""

from __future__ import annotations

import time
from concurrent.futures import Future

import pytest

schemathesis = pytest.importorskip("schemathesis")  # a dev dependency (pyproject.toml)

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

from rag.config import RAGConfig  # noqa: E402
from serving.auth import KeyFile  # noqa: E402

BASE = {"generator": "extractive"}
CASES_PER_MODE = 600


class StubVariant:
    def __init__(self, cfg: RAGConfig):
        self.cfg = cfg

    def answer(self, question: str, query_id: str = "q") -> dict:
        return {"answer": "stub", "citations": [], "cited_ids": [], "context_ids": [],
                "latency_ms": {"generate": 0.1}, "tokens_in": 1, "tokens_out": 1,
                "variant_id": self.cfg.config_hash, "scores": None, "gold_category": None}

    def info(self) -> dict:
        return {"variant_id": self.cfg.config_hash}


def _no_jobs(request: dict) -> Future:
    fut: Future = Future()
    fut.set_result({"config_hash": "stub", "gates": {"passed": False}})
    return fut


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory):
    from serving.app import LocalHandle, local_app
    from serving.pipelines import PipelineService

    tmp = tmp_path_factory.mktemp("fuzz")
    token, _ = KeyFile(tmp / "keys.json").create("admin", name="fuzz")
    stable = RAGConfig(**BASE)
    app = local_app({"store_url": str(tmp / "log.sqlite"), "base": BASE,
                     "auth": {"keys_file": str(tmp / "keys.json")},
                     "limits": {"rate_per_s": 1e6, "burst": 1e6, "max_inflight": 64},
                     "max_variants": 3, "rollout_dir": str(tmp / "rollout")},
                    services={stable.config_hash: PipelineService(BASE, "synthetic")},
                    submit=_no_jobs, deploy=lambda cfg: LocalHandle(StubVariant(cfg)))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    return schema, {"Authorization": f"Bearer {token}"}


def _fuzz(schema, headers: dict, mode: GenerationMode) -> dict[str, int]:
    seen: dict[str, int] = {}
    failures: list[str] = []

    @settings(max_examples=CASES_PER_MODE, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=schema.as_strategy(generation_mode=mode))
    def run(case) -> None:
        resp = case.call(headers=headers)
        key = f"{case.method} {case.path} {resp.status_code}"
        seen[key] = seen.get(key, 0) + 1
        if resp.status_code >= 500:
            failures.append(f"{key}: body={case.body!r} query={case.query!r} "
                            f"path={case.path_parameters!r} -> {resp.text[:300]}")

    run()
    assert not failures, "\n".join(failures[:10])
    return seen


def test_no_5xx_over_1000_generated_requests(fuzz_target):
    schema, headers = fuzz_target
    t0 = time.perf_counter()
    positive = _fuzz(schema, headers, GenerationMode.POSITIVE)
    negative = _fuzz(schema, headers, GenerationMode.NEGATIVE)
    total = sum(positive.values()) + sum(negative.values())
    ops = {k.rsplit(" ", 1)[0] for k in (*positive, *negative)}
    print(f"{total} requests over {len(ops)} operations in {time.perf_counter() - t0:.0f} s; "
          f"status counts: {sorted({**positive, **negative}.items())}")
    assert total >= 1000
    assert len(ops) >= 12  # every route of the spec was exercised
    assert any(k.startswith("POST /query 200") for k in positive)  # the pipeline answered
    assert any(" 422" in k for k in negative)  # invalid bodies were refused, not crashed on
