"""The drain gate (serving.drain): before the driver's flag file exists every request passes;
from the moment it exists /readyz answers 503 `draining`, every other path but /healthz and
/metrics a 503 with Retry-After naming the `server` field, and the gate stays shut."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from serving import drain
from serving.routes_ops import OpsRoutes


@pytest.fixture
def flag(tmp_path, monkeypatch):
    path = tmp_path / "draining"
    monkeypatch.setenv(drain.FLAG_ENV, str(path))
    monkeypatch.setitem(drain._seen, "draining", False)
    return path


def _client() -> TestClient:
    async def ok(request):
        return PlainTextResponse("ok")

    paths = ("/query", "/healthz", "/metrics", "/readyz", "/admin/traffic")
    app = Starlette(routes=[Route(p, ok, methods=["GET", "POST"]) for p in paths])
    return TestClient(drain.DrainGate(app))


def test_gate_refuses_new_requests_from_the_moment_the_flag_exists(flag) -> None:
    client = _client()
    assert client.post("/query").status_code == 200
    assert not drain.draining()
    flag.touch()
    for path in ("/query", "/admin/traffic"):
        r = client.post(path)
        assert r.status_code == 503, path
        assert r.headers["retry-after"] == str(drain.RETRY_AFTER_S)
        assert r.json()["field"] == "server" and "draining" in r.json()["error"]
    for path in ("/healthz", "/metrics", "/readyz"):
        assert client.get(path).status_code == 200, path
    flag.unlink()  # the drain ends with the process: a removed file does not reopen the gate
    assert client.post("/query").status_code == 503


def test_no_flag_variable_means_never_draining(monkeypatch) -> None:
    monkeypatch.delenv(drain.FLAG_ENV, raising=False)
    monkeypatch.setitem(drain._seen, "draining", False)
    assert not drain.draining()
    assert _client().post("/query").status_code == 200


def test_readyz_says_draining_without_probing(flag) -> None:
    def unreachable():
        raise AssertionError("a draining /readyz must not probe the store")

    ingress = SimpleNamespace(handles={"abc": None}, router=SimpleNamespace(stable="abc"),
                              store=SimpleNamespace(url="sqlite:///x", counts=unreachable),
                              policy_handle=None)
    flag.touch()
    r = asyncio.run(OpsRoutes._readyz(ingress))
    assert r.status_code == 503
    assert b'"status":"draining"' in r.body
