"""The ragpilot Ray Serve application: a FastAPI ingress in front of one pipeline deployment per
config hash, with stable/canary/shadow routing, a bandit mode, a durable interaction log,
Prometheus metrics, backpressure and asynchronous tuner evaluations.

    serve run serving.app:app                       # defaults: synthetic world, extractive
    serve run configs/serve/default.yaml            # the documented settings (HTTP 127.0.0.1)
    ragpilot serve --config configs/serve/default.yaml

HTTP ─► Ingress ─► Router ── stable ─► Pipeline_<hash>   (deployment per config hash)
                          ├─ canary ─► Pipeline_<hash>
                          └─ mirror ─► Pipeline_<hash>   (shadow: logged + scored, not returned)

Endpoints: POST /query, POST /feedback, GET /rl/stats, GET /rl/leaderboard,
POST /tuner/evaluate, GET /tuner/jobs/{id}, POST|GET /admin/traffic, GET /metrics, GET /healthz,
OpenAPI at /docs. Hardening (docs/serving.md): /admin/*, /tuner/* need an `admin` API key
(serving.auth; /rl/* a `read` key when `auth.protect_reads`), bodies over
`limits.max_body_bytes` get 413 before parsing, PII is redacted from logs (serving.pii), and a
failed pipeline call is logged as an interaction with `error=1`. `local_app` runs the same
ingress in-process without Ray (ASGI: the fuzz and crash tests). The ingress runs one replica: routing state, bandits, jobs and metrics live in
it (the interaction log is the durable record: it is replayed into the bandits at start-up, and
its `routing` rows bring back the last run-time split, serving.routing_state).
"""

# No `from __future__ import annotations` here: FastAPI must see real classes in the route
# signatures after Ray pickles the ingress class into its replica (forward refs break OpenAPI).
import asyncio
import hashlib
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve

from rag.config import RAGConfig
from rag.env import configure_runtime_env
from rag.errors import ConfigError
from serving.auth import AuthMiddleware, Guard, KeyFile, current_guard, install_guard
from serving.jobs import Job, TunerJobs, run_evaluation
from serving.limits import (
    BodyLimitMiddleware,
    InflightGate,
    TokenBucketLimiter,
    current_body_limit,
    retry_after_header,
    set_body_limit,
)
from serving.metrics import ServeMetrics, current_metrics, install_metrics
from serving.pii import RedactingFilter, leak_count, redact
from serving.pipelines import bind_pipeline, deployment_options
from serving.router import Decision, Router
from serving.routing_state import (
    ROLES,
    peek,
    restorable,
    restored_configs,
    snapshot,
    yaml_fingerprint,
)
from serving.schemas import (
    ApiError,
    EvaluateRequest,
    FeedbackRequest,
    QueryRequest,
    QueryResponse,
    RolloutAdvanceRequest,
    RolloutRollbackRequest,
    RolloutStartRequest,
    ServeSettings,
    TrafficRequest,
)
from serving.store import Interaction, open_store

log = logging.getLogger("ray.serve")
api = FastAPI(title="ragpilot", version="0.1.0",
              description="RAG serving with canary/shadow routing, a bandit router, feedback "
                          "logging and asynchronous tuner evaluations.")
_STATE: dict[str, Any] = {}
_ENDPOINTS = {"/query": "query", "/feedback": "feedback", "/tuner/evaluate": "tuner_evaluate",
              "/admin/traffic": "admin_traffic"}


def _error(status: int, field: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse(status_code=status,
                        content={"error": f"{field}: {message}", "field": field, **extra})


@api.exception_handler(RequestValidationError)
async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    err = exc.errors()[0]
    field = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
    if err.get("type") == "json_invalid":
        field = "body"
    return _error(422, field, err.get("msg", "invalid"), detail=jsonable_encoder(exc.errors()))


@api.exception_handler(ApiError)
async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    return _error(exc.status, exc.field, exc.message)


@api.exception_handler(ConfigError)
async def _config_error(_: Request, exc: ConfigError) -> JSONResponse:
    return _error(422, exc.field, exc.message)


# Outer to inner: request counting (below) -> API keys -> body size -> FastAPI. Starlette puts
# the last-added middleware outermost, so these two are added before the counter.
# State reaches them through functions of serving.limits/serving.auth (see install_guard).
api.add_middleware(BodyLimitMiddleware, limit=current_body_limit)
api.add_middleware(AuthMiddleware, guard=current_guard)


@api.middleware("http")
async def _count_requests(request: Request, call_next):
    response = await call_next(request)
    metrics: ServeMetrics | None = current_metrics()  # not _STATE: see install_metrics
    if metrics is not None:
        metrics.request(_ENDPOINTS.get(request.url.path, "other"), response.status_code)
    return response


def query_features(body: QueryRequest, decision: Decision) -> dict[str, Any]:
    """What the per-query policy may condition on (no raw user ids: 12-hex hashes)."""
    q = body.question.strip()
    words = q.split()

    def h(x: str | None) -> str | None:
        return hashlib.sha256(x.encode()).hexdigest()[:12] if x else None

    return {"question_chars": len(q), "question_words": len(words),
            "wh": words[0].lower() if words else "", "has_digit": any(c.isdigit() for c in q),
            "category_given": body.category is not None, "sticky": decision.sticky_key,
            "user": h(body.user_id), "session": h(body.session_id)}


@serve.deployment(name="Ingress", num_replicas=1)
@serve.ingress(api)
class Ingress:
    """Routes, logs and measures; the pipelines run in their own deployments."""

    def __init__(self, settings: dict[str, Any], handles: dict[str, Any],
                 roles: dict[str, str | None], configs: dict[str, dict[str, Any]]):
        """`handles`: variant id -> pipeline deployment; `roles`: stable/canary/shadow ->
        variant id; `configs`: variant id -> its RAGConfig as JSON."""
        configure_runtime_env()
        self.settings = ServeSettings.from_args(settings)
        s = self.settings
        self.handles = dict(handles)
        self.configs = dict(configs)
        self.store = open_store(s.store_url)
        self.metrics = ServeMetrics(max_variants=s.max_variants)
        _STATE["metrics"] = self.metrics
        install_metrics(self.metrics)
        set_body_limit(s.limits.max_body_bytes)
        self.guard = Guard(KeyFile(s.auth.keys_file), s.auth.enabled, s.auth.protect_reads)
        install_guard(self.guard)
        if s.pii.redact_logs and not any(isinstance(f, RedactingFilter) for f in log.filters):
            log.addFilter(RedactingFilter(s.pii.kinds))
        explicit = [s.config(a).config_hash for a in s.bandit.arms]
        self.router = Router(roles["stable"] or "", s.traffic, s.bandit, canary=roles["canary"],
                             shadow=roles["shadow"], arms=explicit or list(self.handles))
        self._explicit_arms = bool(explicit)
        self._routing_fp = yaml_fingerprint(s, roles)
        self.restored = self._restore_routing(restorable(self.store, s, roles))
        for cat, variant, reward, leaks in self.store.bandit_history(pii_leaks=True):
            self.router.update(cat, variant, self._policy_reward(reward, leaks))
        self.limiter = TokenBucketLimiter(s.limits.rate_per_s, s.limits.burst,
                                          s.limits.max_clients)
        self.gate = InflightGate(s.limits.max_inflight)
        self.jobs = TunerJobs(self._submit_eval, s.max_jobs, on_done=self._job_done)
        self.gates: dict[str, dict[str, bool]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._deploy_lock = asyncio.Lock()
        self.metrics.set_traffic(self.router.traffic.canary_percent,
                                 self.router.traffic.shadow_percent)

    # ---- routing that survives a restart (serving.routing_state) ----------------------------
    def _restore_routing(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        """Serve a stored routing row (the builder deployed its variants); None when there is
        none to serve. Returns what the restored row was (shown by GET /admin/traffic)."""
        if row is None:
            return None
        st = row["state"]
        ids = [st[r] for r in ROLES if st.get(r)]
        if any(v not in self.handles for v in ids):
            log.warning("routing: stored row %d needs variants %s that are not deployed; "
                        "serving the args", row["seq"], sorted(set(ids) - set(self.handles)))
            return None
        for v in ids:
            self.configs.setdefault(v, st["configs"][v])
            if not self._explicit_arms and v not in self.router.arms:
                self.router.add_arm(v)
        self.router.set_state(st)
        log.warning("routing: restored the split set by %s (row %d): stable %s, canary %s "
                    "%.1f%%, shadow %s %.1f%%", row["action"], row["seq"], st["stable"],
                    st["canary"], st["canary_percent"], st["shadow"], st["shadow_percent"])
        return {"seq": row["seq"], "ts": row["ts"], "action": row["action"]}

    def _change_routing(self, action: str, change) -> dict[str, Any]:
        """Apply `change()` to the router and append the new split to the store; if the store
        refuses the row, the router goes back to the split it had and the caller gets a 503
        (a change that would not survive a restart is not made)."""
        before = self.router.state()
        state = change()
        try:
            self.store.save_routing(self._routing_fp, action,
                                    snapshot(self.router.state(), self.configs))
        except Exception as exc:  # noqa: BLE001 - any store failure: undo, say why
            self.router.set_state(before)
            log.error("routing: %s not applied, the store refused it: %s: %s", action,
                      type(exc).__name__, exc)
            raise ApiError("store", f"routing not changed: the store could not record it "
                                    f"({type(exc).__name__}: {exc})", 503) from None
        self.metrics.set_traffic(self.router.traffic.canary_percent,
                                 self.router.traffic.shadow_percent)
        return state

    # ---- serving ------------------------------------------------------------------------------
    @api.post("/query", response_model=QueryResponse)
    async def query(self, body: QueryRequest, request: Request) -> QueryResponse:
        cap = self.settings.limits.max_question_chars
        if len(body.question) > cap:
            raise ApiError("question", f"is {len(body.question)} characters; the limit is "
                                       f"{cap} (limits.max_question_chars)")
        self._rate_limit(request)
        if not self.gate.try_enter():
            self.metrics.rejected.labels("queue_full").inc()
            raise HTTPException(429, detail=f"server busy: {self.gate.limit} requests in flight",
                                headers={"Retry-After": retry_after_header(
                                    self.gate.retry_after_s)})
        self.metrics.inflight.set(self.gate.inflight)
        try:
            return await self._answer(body)
        finally:
            self.gate.leave()
            self.metrics.inflight.set(self.gate.inflight)

    def client_id(self, request: Request) -> str:
        """Who a request is for the rate limiter: `key:<id>` when it carries a valid API key
        (any role; a made-up or revoked token does not count), else `ip:<address>` of the
        connection. Never a body field: `user_id` is the client's to choose per request."""
        token = Guard.token_from({k.lower(): v for k, v in request.headers.items()})
        if token and self.guard.keys is not None:
            try:
                rec = self.guard.keys.verify(token)
            except ConfigError:  # unreadable key file: fall back to the address
                rec = None
            if rec is not None:
                return f"key:{rec.id}"
        return f"ip:{request.client.host if request.client else 'unknown'}"

    def _rate_limit(self, request: Request) -> None:
        """429 with Retry-After when this client's token bucket (shared by /query and
        /feedback) is empty."""
        wait = self.limiter.acquire(self.client_id(request))
        if wait > 0:
            self.metrics.rejected.labels("rate_limit").inc()
            raise HTTPException(429, detail=f"rate limit: {self.settings.limits.rate_per_s:g} "
                                f"requests/s per client", headers={
                                    "Retry-After": retry_after_header(wait)})

    async def _answer(self, body: QueryRequest) -> QueryResponse:
        t0 = time.perf_counter()
        iid = uuid.uuid4().hex
        category = body.category or "default"
        d = self.router.route(iid, body.user_id, body.session_id, category)
        try:
            res = await self.handles[d.variant].answer.remote(body.question, iid)
        except Exception as exc:  # a replica's typed input error is the caller's 422
            cause = getattr(exc, "cause", None)
            if isinstance(cause, ConfigError):
                raise ApiError(cause.field, cause.message) from None
            await self._log_failure(iid, body, d.variant, d.route, d.propensity, category,
                                    features=query_features(body, d), exc=exc, t0=t0)
            raise ApiError("pipeline", f"variant {d.variant} failed ({type(exc).__name__}); "
                                       f"logged as interaction {iid} with error=1", 502) from None
        scores = self._scores(res, body.question)
        lat = dict(res["latency_ms"])
        lat["pipeline"] = (time.perf_counter() - t0) * 1000.0
        if d.shadow is not None:
            task = asyncio.create_task(self._mirror(d, iid, body, category, res, lat))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        row = Interaction(id=iid, question=self._stored(body.question), variant_id=d.variant,
                          route=d.route, propensity=d.propensity,
                          answer=self._stored(res["answer"]), category=category,
                          features=query_features(body, d), context_ids=res["context_ids"],
                          citations=res["citations"], latency_ms=lat,
                          tokens_in=res["tokens_in"], tokens_out=res["tokens_out"],
                          scores=scores)
        t1 = time.perf_counter()
        await asyncio.to_thread(self.store.log_interaction, row)  # ack only once committed
        lat["store"] = (time.perf_counter() - t1) * 1000.0
        lat["total"] = (time.perf_counter() - t0) * 1000.0
        f1 = (res["scores"] or {}).get("f1")
        self.metrics.observe_answer(d.variant, d.route, lat, res["tokens_in"],
                                    res["tokens_out"], f1)
        return QueryResponse(interaction_id=iid, answer=res["answer"],
                             citations=res["citations"], cited_ids=res["cited_ids"],
                             context_ids=res["context_ids"], variant_id=d.variant, route=d.route,
                             propensity=d.propensity, latency_ms=lat,
                             tokens_in=res["tokens_in"], tokens_out=res["tokens_out"])

    def _stored(self, text: str) -> str:
        """What the interaction log keeps of a question/answer (`pii.redact_store`)."""
        return redact(text, self.settings.pii.kinds) if self.settings.pii.redact_store else text

    def _scores(self, res: dict[str, Any], question: str) -> dict[str, float] | None:
        """The replica's scores plus `pii_leaks` (serving.pii.leak_count of the answer against
        the question: the replica does not return context texts) unless detection is off."""
        mode = self.settings.pii.leak_detection
        if mode == "off":
            return res["scores"]
        return {**(res["scores"] or {}), "pii_leaks": float(leak_count(
            res["answer"], question, mode=mode, kinds=self.settings.pii.kinds))}

    async def _log_failure(self, iid: str, body: QueryRequest, variant: str, route: str,
                           propensity: float, category: str, features: dict[str, Any],
                           exc: BaseException, t0: float, shadow: bool = False,
                           parent_id: str | None = None) -> None:
        """Record a failed pipeline call as an interaction with error=1 (empty answer), so
        exports and the rollout's burn-rate check see it. Never raises."""
        log.error("pipeline %s failed for interaction %s: %s: %s", variant, iid,
                  type(exc).__name__, exc)
        row = Interaction(id=iid, question=self._stored(body.question), variant_id=variant,
                          route=route, propensity=propensity, answer="", category=category,
                          features={**features, "error_type": type(exc).__name__},
                          latency_ms={"pipeline": (time.perf_counter() - t0) * 1000.0},
                          shadow=shadow, parent_id=parent_id, error=True)
        try:
            await asyncio.to_thread(self.store.log_interaction, row)
        except Exception:
            log.exception("could not log the failed interaction %s", iid)

    async def _mirror(self, d: Decision, parent: str, body: QueryRequest, category: str,
                      served: dict[str, Any], served_lat: dict[str, float]) -> None:
        """Answer the same question with the shadow variant; log and score, never return."""
        sid = uuid.uuid4().hex
        t0 = time.perf_counter()
        try:
            try:
                res = await self.handles[d.shadow].answer.remote(body.question, sid)
            except Exception as exc:
                await self._log_failure(sid, body, str(d.shadow), "shadow",
                                        self.router.traffic.shadow_percent / 100, category,
                                        query_features(body, d), exc, t0, shadow=True,
                                        parent_id=parent)
                raise
            lat = dict(res["latency_ms"])
            lat["pipeline"] = (time.perf_counter() - t0) * 1000.0
            row = Interaction(id=sid, question=self._stored(body.question),
                              variant_id=str(d.shadow), route="shadow",
                              propensity=self.router.traffic.shadow_percent / 100,
                              answer=self._stored(res["answer"]), category=category,
                              features=query_features(body, d), context_ids=res["context_ids"],
                              citations=res["citations"], latency_ms=lat,
                              tokens_in=res["tokens_in"], tokens_out=res["tokens_out"],
                              shadow=True, parent_id=parent,
                              scores=self._scores(res, body.question))
            await asyncio.to_thread(self.store.log_interaction, row)
            f1 = (res["scores"] or {}).get("f1")
            self.metrics.observe_answer(str(d.shadow), "shadow", lat, res["tokens_in"],
                                        res["tokens_out"], f1)
            self.metrics.observe_shadow(served_lat["pipeline"], lat["pipeline"],
                                        (served["scores"] or {}).get("f1"), f1)
        except Exception:
            self.metrics.shadow_requests.labels("error").inc()
            log.exception("shadow request %s (parent %s) failed", sid, parent)

    @api.post("/feedback")
    async def feedback(self, body: FeedbackRequest, request: Request) -> dict[str, Any]:
        """Store the user's reward. The bandit learns `policy_reward`: the reward minus
        `pii.leak_penalty` per PII leak the answer had (`rl.tuner.reward.feedback_reward`)."""
        self._rate_limit(request)
        ack = await asyncio.to_thread(self.store.add_feedback, body.interaction_id, body.reward)
        learned = self._policy_reward(ack.reward, ack.pii_leaks)
        if ack.route == "bandit":
            self.router.update(ack.category, ack.variant_id, learned)
        self.metrics.observe_feedback(ack.variant_id, ack.route, ack.reward)
        return {"stored": True, "interaction_id": ack.interaction_id, "reward": ack.reward,
                "variant_id": ack.variant_id, "route": ack.route, "pii_leaks": ack.pii_leaks,
                "policy_reward": learned}

    def _policy_reward(self, reward: float, pii_leaks: float) -> float:
        """What the policy learns from a logged reward (issue 10: PII leaks feed penalty P)."""
        from rl.tuner.reward import feedback_reward

        return feedback_reward(reward, pii_leaks, self.settings.pii.leak_penalty)

    # ---- control plane ------------------------------------------------------------------------
    @api.get("/rl/stats")
    async def stats(self) -> dict[str, Any]:
        counts = await asyncio.to_thread(self.store.counts)
        by_variant = await asyncio.to_thread(self.store.variant_summary)
        return {"traffic": self.router.state(), "variants": self.configs, "store": counts,
                "by_variant": by_variant, "deltas": self.metrics.deltas(),
                "inflight": self.gate.inflight, "peak_inflight": self.gate.peak,
                "jobs": self.jobs.counts(), "gates": self.gates,
                "shadow_tasks_pending": len(self._tasks)}

    @api.get("/rl/leaderboard")
    async def leaderboard(self, category: str | None = None) -> dict[str, Any]:
        rows = await asyncio.to_thread(self.store.variant_summary)
        return {"mode": self.router.traffic.mode,
                "bandit": self.router.leaderboard(category),
                "variants": [r for r in rows if r["route"] != "shadow"]}

    @api.get("/admin/traffic")
    async def get_traffic(self) -> dict[str, Any]:
        return {**self.router.state(), "restored": self.restored}

    # ---- evidence-gated promotion (rl.promotion.state_machine; same state as `ragpilot rollout`) -----------
    def _rollout(self):
        from rl.promotion.state_machine import PromotionStateMachine

        d = Path(self.settings.rollout_dir)
        if not (d / "state.json").exists():
            raise ApiError("rollout", f"no rollout in {d}; POST /admin/rollout/start", 404)
        return PromotionStateMachine.load(d)

    def _apply_rollout_traffic(self, sm, action: str) -> dict[str, Any]:
        """Point the router at the split the rollout's stage asks for, stable included: the
        candidate at `full`, else the rollout's `stable` (kept in its state.json), so a
        rollback from any stage, `full` included, serves the old stable again."""
        from serving.rollout_cmd import router_settings

        t = router_settings(sm)
        stable: Any = t["stable"]
        warning = None
        if stable not in self.handles:  # a state written elsewhere: never route to nothing
            warning = (f"rollout stable {stable!r} is not deployed here; the router keeps "
                       f"{self.router.stable!r} (set it with POST /admin/traffic `stable`)")
            log.warning(warning)
            stable = False
        state = self._change_routing(action, lambda: self.router.set_traffic(
            "split", t["canary_percent"], t["shadow_percent"], t["canary"], t["shadow"],
            stable=stable))
        return {**state, "warning": warning} if warning else state

    @api.get("/admin/rollout")
    async def rollout_status(self) -> dict[str, Any]:
        from serving.rollout_cmd import status_dict

        self._rollout()
        return jsonable_encoder(status_dict(self.settings.rollout_dir))

    @api.post("/admin/rollout/start")
    async def rollout_start(self, body: RolloutStartRequest) -> dict[str, Any]:
        from rl.promotion.state_machine import (
            DEFAULTS_PATH,
            PromotionSettings,
            PromotionStateMachine,
        )

        for name, vid in (("candidate", body.candidate), ("stable", body.stable)):
            if vid is not None and vid not in self.handles:
                raise ApiError(name, f"no deployed variant {vid!r} (have: "
                                     f"{', '.join(sorted(self.handles))})", 404)
        sm = PromotionStateMachine.start(self.settings.rollout_dir, body.candidate,
                                         body.stable or self.router.stable, body.manifest_id,
                                         PromotionSettings.from_yaml(DEFAULTS_PATH),
                                         force=body.force)
        return {"rollout_id": sm.state.rollout_id, "stage": sm.stage,
                "traffic": self._apply_rollout_traffic(sm, "rollout/start")}

    @api.post("/admin/rollout/advance")
    async def rollout_advance(self, body: RolloutAdvanceRequest) -> dict[str, Any]:
        from rl.promotion.evaluators import EvaluationReport
        from serving.rollout_cmd import reports_from_file

        sm = self._rollout()
        if sm.done:
            raise ApiError("rollout", f"rollout is {sm.stage}; start a new one", 409)
        reports = []
        for i, r in enumerate(body.reports):
            try:
                reports.append(EvaluationReport.from_dict(r))
            except (KeyError, TypeError, ValueError) as exc:
                raise ApiError(f"reports.{i}", f"not an EvaluationReport: {exc}") from None
        if body.from_log:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "interactions.jsonl"
                await asyncio.to_thread(self.store.export_jsonl, path)
                if path.stat().st_size:
                    reports += reports_from_file(path, sm,
                                                 pii_penalty=self.settings.pii.leak_penalty)
        decision = None
        for rep in reports:
            decision = sm.observe(rep)
            if decision.action in ("rollback", "advance"):
                break
        if decision is None or decision.action not in ("rollback", "advance"):
            decision = sm.advance()
        return {"decision": {"action": decision.action, "from": decision.from_stage,
                             "to": decision.to_stage, "reason": decision.reason},
                "stage": sm.stage, "traffic": self._apply_rollout_traffic(
                    sm, f"rollout/{decision.action}")}

    @api.post("/admin/rollout/rollback")
    async def rollout_rollback(self, body: RolloutRollbackRequest) -> dict[str, Any]:
        sm = self._rollout()
        d = sm.rollback(f"manual (API): {body.reason}")
        return {"decision": {"action": d.action, "from": d.from_stage, "to": d.to_stage,
                             "reason": d.reason}, "stage": sm.stage,
                "traffic": self._apply_rollout_traffic(sm, "rollout/rollback")}

    @api.post("/admin/traffic")
    async def set_traffic(self, body: TrafficRequest) -> dict[str, Any]:
        given = body.model_fields_set
        canary: Any = False
        shadow: Any = False
        stable: Any = False
        if "stable" in given:
            if body.stable is None:
                raise ApiError("stable", "cannot be removed (something must serve); send a "
                                         "variant id or config overrides")
            stable = await self._variant_for(body.stable, "stable")
        if "canary_config" in given:
            canary = await self._variant_for(body.canary_config, "canary_config")
        if "shadow_config" in given:
            shadow = await self._variant_for(body.shadow_config, "shadow_config")
        return self._change_routing("admin/traffic", lambda: self.router.set_traffic(
            body.mode, body.canary_percent, body.shadow_percent, canary, shadow,
            stable=stable))

    async def _variant_for(self, spec: dict[str, Any] | str | None, field: str) -> str | None:
        """A deployed variant id for `spec` (a hash, or overrides deployed on demand)."""
        if spec is None:
            return None
        if isinstance(spec, str):
            if spec not in self.handles:
                raise ConfigError(field, f"no deployed variant {spec!r} (have: "
                                         f"{', '.join(sorted(self.handles))})")
            return spec
        cfg = self._limited_config(spec, field)
        h = cfg.config_hash
        async with self._deploy_lock:
            if h in self.handles:
                return h
            if len(self.handles) >= self.settings.max_variants:
                raise ApiError(field, f"already {len(self.handles)} variants deployed "
                                        f"(max_variants); reuse one by its id", 409)
            self.handles[h] = await asyncio.to_thread(self._deploy, cfg)
            self.configs[h] = cfg.model_dump(mode="json")
            if not self._explicit_arms:
                self.router.add_arm(h)
        return h

    def _deploy(self, cfg: RAGConfig):
        """Deploy `cfg` as its own application (`ragpilot-<hash>`); returns once ready."""
        s = self.settings
        p = s.pipelines
        bound = bind_pipeline(cfg, s.dataset, s.index_dir, deployment_options(
            p.num_cpus, p.max_ongoing_requests, p.num_replicas, p.autoscaling), s.indexes)
        log.info("deploying variant %s", cfg.config_hash)
        return serve.run(bound, name=f"ragpilot-{cfg.config_hash}", route_prefix=None,
                         blocking=False)

    def _limited_config(self, overrides: dict[str, Any], field: str) -> RAGConfig:
        """`base` + overrides, validated, with `k` within `limits.max_k`."""
        cfg = self.settings.config(overrides, where=field)
        cap = self.settings.limits.max_k
        if cfg.k > cap:
            raise ApiError(f"{field}.k", f"is {cfg.k}; the limit is {cap} (limits.max_k)")
        return cfg

    # ---- tuner ----------------------------------------------------------------------------------
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

    @api.post("/tuner/evaluate", status_code=202)
    async def tuner_evaluate(self, body: EvaluateRequest) -> dict[str, Any]:
        cap = self.settings.limits.max_batch_size
        if body.batch_size is not None and body.batch_size > cap:
            raise ApiError("batch_size", f"is {body.batch_size}; the limit is {cap} "
                                         "(limits.max_batch_size)")
        cfg = self._limited_config(body.config, "config")
        job = self.jobs.submit({"config": cfg.model_dump(mode="json"), "dataset": body.dataset,
                                "split": body.split, "batch_size": body.batch_size,
                                "seed": body.seed})
        return {"job_id": job.id, "status": job.status, "variant_id": cfg.config_hash,
                "poll": f"/tuner/jobs/{job.id}"}

    @api.get("/tuner/jobs/{job_id}")
    async def tuner_job(self, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            raise ApiError("job_id", f"unknown job {job_id!r}", 404)
        return job.to_dict()

    # ---- operations -----------------------------------------------------------------------------
    @api.get("/metrics")
    async def metrics_endpoint(self) -> Response:
        body, ctype = self.metrics.render()
        return Response(content=body, media_type=ctype)

    @api.get("/healthz")
    async def healthz(self) -> JSONResponse:
        """Readiness: 200 once the store answers and every pipeline has a warm replica (each is
        asked for its info, 5 s at most). Otherwise 503 (never a 500), JSON with `status`
        `starting` (no answer within 5 s) or `unavailable` (the store or a replica failed),
        `error` saying what failed and `failed`: variant id -> exception type and message."""
        variants = sorted(self.handles)
        body: dict[str, Any] = {"variants": variants, "stable": self.router.stable,
                                "store": self.store.url}
        try:
            await asyncio.to_thread(self.store.counts)
        except Exception as exc:  # noqa: BLE001 - any store failure means "not ready"
            log.error("healthz: store %s failed: %s: %s", self.store.url,
                      type(exc).__name__, exc)
            return JSONResponse(status_code=503, content={
                **body, "status": "unavailable",
                "error": f"store: {type(exc).__name__}: {exc}", "failed": {}})

        async def probe(v: str) -> BaseException | None:
            try:
                await self.handles[v].info.remote()
            except Exception as exc:  # noqa: BLE001 - a dead replica, an actor error, ...
                return exc
            return None

        tasks = {v: asyncio.ensure_future(probe(v)) for v in variants}
        done, pending = await asyncio.wait(tasks.values(), timeout=5.0) if tasks else \
            (set(), set())
        for t in pending:
            t.cancel()
        failed = {v: f"{type(t.result()).__name__}: {t.result()}" for v, t in tasks.items()
                  if t in done and t.result() is not None}
        slow = sorted(v for v, t in tasks.items() if t in pending)
        if failed:
            log.error("healthz: pipeline replicas failed: %s", failed)
            return JSONResponse(status_code=503, content={
                **body, "status": "unavailable", "failed": failed, "starting": slow,
                "error": f"pipeline replica failed for {len(failed)} of {len(variants)} "
                         f"variant(s): {', '.join(sorted(failed))}"})
        if slow:
            return JSONResponse(status_code=503, content={
                **body, "status": "starting", "failed": {}, "starting": slow,
                "error": f"no answer within 5 s from {', '.join(slow)}"})
        return JSONResponse(status_code=200, content={**body, "status": "ok"})


def _resolved(s: ServeSettings) -> ServeSettings:
    """Relative store and key-file paths resolved against the current directory (replicas
    run elsewhere)."""
    if "://" not in s.store_url:
        s = s.model_copy(update={"store_url": str(Path(s.store_url).resolve())})
    keys = str(Path(s.auth.keys_file).resolve())
    return s.model_copy(update={"auth": s.auth.model_copy(update={"keys_file": keys})})


def build_app(args: dict[str, Any] | None = None):
    """The application for `args` (ServeSettings as a mapping; what the YAML's `args:` holds).
    A relative `store_url` path is resolved against the current directory."""
    configure_runtime_env()
    s = _resolved(ServeSettings.from_args(args))
    roles, configs = _variants(s)
    p = s.pipelines
    opts = deployment_options(p.num_cpus, p.max_ongoing_requests, p.num_replicas,
                              p.autoscaling)
    handles = {h: bind_pipeline(c, s.dataset, s.index_dir, opts, s.indexes)
               for h, c in configs.items()}
    return Ingress.options(ray_actor_options={"num_cpus": s.ingress_num_cpus},
                           max_ongoing_requests=s.limits.max_inflight + 64).bind(
        s.model_dump(mode="json"), handles, roles,
        {h: c.model_dump(mode="json") for h, c in configs.items()})


def _variants(s: ServeSettings) -> tuple[dict[str, str | None], dict[str, RAGConfig]]:
    """(role -> variant id, variant id -> config) of the configs the settings deploy, plus
    those of the routing stored at run time that the ingress will serve
    (serving.routing_state). `roles` are always the args' own."""
    roles: dict[str, str | None] = {"stable": None, "canary": None, "shadow": None}
    configs: dict[str, RAGConfig] = {}
    for role in ("stable", "canary", "shadow"):
        over = getattr(s, role)
        if over is not None:
            cfg = s.config(over, where=f"serve.{role}")
            configs[cfg.config_hash] = cfg
            roles[role] = cfg.config_hash
    for i, arm in enumerate(s.bandit.arms):
        cfg = s.config(arm, where=f"serve.bandit.arms.{i}")
        configs[cfg.config_hash] = cfg
    if len(configs) > s.max_variants:
        raise ConfigError("serve.max_variants", f"{len(configs)} distinct configs to deploy; "
                                                f"the limit is {s.max_variants}")
    extra = {h: c for h, c in restored_configs(peek(s, roles)).items() if h not in configs}
    if len(configs) + len(extra) > s.max_variants:
        log.warning("routing: the stored split needs %d more deployments than max_variants "
                    "allows; serving the args", len(extra))
    else:
        configs.update(extra)
    return roles, configs


# ---- in-process (no Ray): the same ingress as a plain ASGI app ----------------------------------
class _LocalMethod:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args: Any):
        return asyncio.to_thread(self.fn, *args)


class LocalHandle:
    """Stands in for a deployment handle: `await h.answer.remote(q, iid)` runs
    `service.answer(q, iid)` in a thread (any object with `answer` and `info`)."""

    def __init__(self, service: Any):
        self.service = service
        self.answer = _LocalMethod(service.answer)
        self.info = _LocalMethod(service.info)


def local_app(args: dict[str, Any] | None = None, services: dict[str, Any] | None = None,
              submit: Any = None, deploy: Any = None) -> FastAPI:
    """The ingress of `build_app(args)` in this process, without Ray or Serve: the FastAPI
    app with every route, middleware (API keys, body limit) and the real store, for ASGI test
    clients and `uvicorn`. `services`: variant id -> object with `answer`/`info` (default:
    a `PipelineService` per config, built here); `submit`: tuner-job submitter (default: a
    thread running `run_evaluation`); `deploy`: RAGConfig -> handle for run-time variants
    (default: a new PipelineService). One local app per process (routes are module-global)."""
    from concurrent.futures import ThreadPoolExecutor

    from serving.pipelines import PipelineService

    s = _resolved(ServeSettings.from_args(args))
    roles, configs = _variants(s)
    services = dict(services or {})

    def make(cfg: RAGConfig) -> LocalHandle:
        return LocalHandle(PipelineService(cfg.model_dump(mode="json"), s.dataset, s.index_dir,
                                           indexes=s.indexes))

    handles = {h: LocalHandle(services[h]) if h in services else make(c)
               for h, c in configs.items()}
    cls = next(b for b in Ingress.func_or_class.__mro__ if "query" in b.__dict__)
    inst = cls.__new__(cls)
    cls.__init__(inst, s.model_dump(mode="json"), handles, roles,
                 {h: c.model_dump(mode="json") for h, c in configs.items()})
    pool = ThreadPoolExecutor(1, thread_name_prefix="tuner-job")
    inst.jobs = TunerJobs(submit or (lambda req: pool.submit(run_evaluation, req)),
                          s.max_jobs, on_done=inst._job_done)
    inst._deploy = deploy or make
    api.dependency_overrides[_servable_dependency()] = lambda: inst
    return api


def _servable_dependency():
    """The dependency Ray's class-based view injects `self` with (overridden locally)."""
    import inspect

    def walk(router):  # FastAPI >= 0.137 nests included routers (`original_router`)
        for route in router.routes:
            yield route
            if hasattr(route, "original_router"):
                yield from walk(route.original_router)

    for route in walk(api):
        if getattr(getattr(route, "endpoint", None), "_serve_cls", None) is not None:
            first = next(iter(inspect.signature(route.endpoint).parameters.values()))
            return first.default.dependency
    raise RuntimeError("no class-based routes found on the ragpilot API")


app = build_app()
