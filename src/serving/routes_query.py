"""Handlers of the ingress's serving routes (declared on serving.app.Ingress): `POST /query`
(route, answer, log, measure; mirror to the shadow variant) and `POST /feedback` (store the
user's reward; the bandit learns from it).

An answer to a question without gold (its record carries `signal_input`,
serving.pipelines.add_scores) is stored and returned without its reference-free signals; then,
off the request path, a task asks the pipeline deployment for them (`signals.remote`) and
appends them to the store (`InteractionStore.add_signals`), so the stored row carries `sig_*`
for the rollout's evidence a few hundred ms after the reply. At most MAX_PENDING_SIGNALS such
tasks run per ingress replica; past that a row is left unscored (logged, and counted by the
evidence under quality `none`, never as a zero), so an overload sheds scoring, not answers.

`QueryRoutes` is a mixin of `serving.app.Ingress` and uses its state: settings, handles,
router, store, metrics, limiter, gate, guard, the pending shadow tasks `_tasks` and signal
tasks `_signal_tasks`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from typing import Any

from fastapi import Request

from rag.errors import ConfigError
from serving.api import log
from serving.auth import Guard
from serving.limits import retry_after_header
from serving.pii import leak_count, redact
from serving.request_log import note
from serving.schemas import ApiError, FeedbackRequest, QueryRequest, QueryResponse
from serving.store import Interaction
from serving.traffic import Decision

MAX_PENDING_SIGNALS = 256
"""Signal scorings (`QueryRoutes._score_later`) one ingress replica runs at once; more rows
wait for none and stay unscored."""


def query_features(body: QueryRequest, decision: Decision) -> dict[str, Any]:
    """What the per-query policy may condition on (no raw user ids: 12-hex hashes)."""
    q = body.question.strip()
    words = q.split()

    def h(x: str | None) -> str | None:
        return hashlib.sha256(x.encode()).hexdigest()[:12] if x else None

    return {"question_chars": len(q), "question_words": len(words),
            "wh": words[0].lower() if words else "", "has_digit": any(c.isdigit() for c in q),
            "category_given": body.category is not None, "sticky": decision.sticky_key,
            "user": h(body.user_id), "session": h(body.session_id),
            "history_turns": len(body.history or ())}



class QueryRoutes:
    """/query and /feedback (a mixin of serving.app.Ingress)."""

    async def _query(self, body: QueryRequest, request: Request) -> QueryResponse:
        cap = self.settings.limits.max_question_chars
        if len(body.question) > cap:
            raise ApiError("question", f"is {len(body.question)} characters; the limit is "
                                       f"{cap} (limits.max_question_chars)")
        await self._rate_limit(request)
        if not self.gate.try_enter():
            self.metrics.rejected.labels("queue_full").inc()
            raise ApiError("server", f"busy: {self.gate.limit} requests in flight", 429,
                           headers={"Retry-After": retry_after_header(self.gate.retry_after_s)})
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
        return f"ip:{self._client_address(request)}"

    def _client_address(self, request: Request) -> str:
        """The connection's address, or behind a trusted proxy (`limits.trusted_proxies`) the
        nearest `X-Forwarded-For` hop that is not one."""
        import ipaddress

        addr = request.client.host if request.client else "unknown"
        nets = [ipaddress.ip_network(n, strict=False)
                for n in self.settings.limits.trusted_proxies]

        def trusted(a: str) -> bool:
            try:
                ip = ipaddress.ip_address(a)
            except ValueError:
                return False
            return any(ip in n for n in nets)

        forwarded = request.headers.get("x-forwarded-for")
        if not nets or not forwarded or not trusted(addr):
            return addr
        hops = [h.strip() for h in forwarded.split(",") if h.strip()]
        return next((h for h in reversed(hops) if not trusted(h)), hops[0] if hops else addr)

    async def _rate_limit(self, request: Request) -> None:
        """429 with Retry-After when this client's token bucket (shared by /query and
        /feedback; by every ingress replica when it lives in the store) is empty."""
        client = self.client_id(request)
        wait = (await asyncio.to_thread(self.limiter.acquire, client)
                if getattr(self.limiter, "blocking", False) else self.limiter.acquire(client))
        if wait > 0:
            self.metrics.rejected.labels("rate_limit").inc()
            raise ApiError("client", f"rate limit: {self.settings.limits.rate_per_s:g} "
                                     "requests/s per client", 429,
                           headers={"Retry-After": retry_after_header(wait)})

    async def _answer(self, body: QueryRequest) -> QueryResponse:
        if getattr(self, "_policy_mode", lambda: False)():  # serving.routes_policy
            return await self._answer_policy(body)
        t0 = time.perf_counter()
        iid = uuid.uuid4().hex
        category = body.category or "default"
        await self._sync_state()  # siblings' routing changes and feedback (replica_sync)
        d = self.router.route(iid, body.user_id, body.session_id, category)
        note(interaction_id=iid, variant=d.variant, route=d.route)
        if self.settings.logs.include_question:
            note(question=(redact(body.question, self.settings.pii.kinds)
                           if self.settings.pii.redact_logs else body.question))
        try:
            res = await self.handles[d.variant].answer.remote(*body.answer_args(iid))
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
        self._score_later(iid, self.handles[d.variant], res)
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

    def _score_later(self, iid: str, handle: Any, res: dict[str, Any]) -> None:
        """When the stored interaction `iid`'s record `res` has `signal_input` (no gold), start
        a task that gets its signals from `handle.signals` (the deployment that answered) and
        appends them to the store; the caller does not wait for it. Skipped when
        MAX_PENDING_SIGNALS are pending or the handle has no `signals`: counted in
        `_signals_skipped` (GET /rl/stats `signals.skipped`) and logged."""
        payload = res.get("signal_input")
        if payload is None:
            return
        scorer = getattr(handle, "signals", None)
        if len(self._signal_tasks) >= MAX_PENDING_SIGNALS or scorer is None:
            self._signals_skipped += 1
            log.warning("interaction %s stored without signals (%s; %d unscored so far)", iid,
                        "no signals method" if scorer is None
                        else f"{len(self._signal_tasks)} scorings pending",
                        self._signals_skipped)
            return

        async def score() -> None:
            try:
                got = await scorer.remote(payload)
                await asyncio.to_thread(self.store.add_signals, iid, got["scores"], got["ms"])
            except Exception:
                log.exception("signals of interaction %s not stored", iid)

        task = asyncio.create_task(score())
        self._signal_tasks.add(task)
        task.add_done_callback(self._signal_tasks.discard)

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
                res = await self.handles[d.shadow].answer.remote(*body.answer_args(sid))
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
            self._score_later(sid, self.handles[d.shadow], res)
            f1 = (res["scores"] or {}).get("f1")
            self.metrics.observe_answer(str(d.shadow), "shadow", lat, res["tokens_in"],
                                        res["tokens_out"], f1)
            self.metrics.observe_shadow(served_lat["pipeline"], lat["pipeline"],
                                        (served["scores"] or {}).get("f1"), f1)
        except Exception:
            self.metrics.shadow_requests.labels("error").inc()
            log.exception("shadow request %s (parent %s) failed", sid, parent)

    async def _feedback(self, body: FeedbackRequest, request: Request) -> dict[str, Any]:
        """Store the user's reward. The bandit learns `policy_reward`: the reward minus
        `pii.leak_penalty` per PII leak the answer had (`rl.kernel.reward.feedback_reward`)."""
        await self._rate_limit(request)
        ack = await asyncio.to_thread(self.store.add_feedback, body.interaction_id, body.reward)
        learned = self._policy_reward(ack.reward, ack.pii_leaks)
        if ack.route == "bandit":  # learned from the store, in one order on every replica
            await self._sync_state(force=True)
        self.metrics.observe_feedback(ack.variant_id, ack.route, ack.reward)
        return {"stored": True, "interaction_id": ack.interaction_id, "reward": ack.reward,
                "variant_id": ack.variant_id, "route": ack.route, "pii_leaks": ack.pii_leaks,
                "policy_reward": learned}

    def _policy_reward(self, reward: float, pii_leaks: float) -> float:
        """What the policy learns from a logged reward (PII leaks feed the penalty P)."""
        from rl.kernel.reward import feedback_reward

        return feedback_reward(reward, pii_leaks, self.settings.pii.leak_penalty)

