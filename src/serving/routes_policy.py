"""`/query` when the traffic mode is `policy`: the policy deployment (serving.policy_router)
picks the config per request and answers; the ingress logs the pick and measures.

`PolicyRoutes` is a mixin of `serving.app.Ingress` (uses its settings, store, metrics,
`policy_handle` and the helpers of `serving.routes_query.QueryRoutes`). The interaction row of
a policy-routed request: route `policy`, `variant_id` = the drawn arm's config hash,
`propensity` = the probability it was drawn with (>= epsilon / M), `policy_id`, `arm`,
`features_hash`, and the feature vector in `features.policy_x` (for off-policy evaluation of
another policy on the same log: `rl.promotion.log_evaluators.policy_from_log`); with a candidate
explored beside the policy, `features.policy_candidate_id` and `policy_candidate_share` too
(the propensity is then the mixture's, candidate share included). A threshold cascade's
request carries its two decisions (the cheap arm, propensity 1; escalate or not, with its
propensity, confidence and τ) in `features.policy_decisions`; `arm` is 1 when it escalated,
and `propensity` is the product of the two.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from rag.errors import ConfigError
from serving.schemas import ApiError, QueryRequest, QueryResponse
from serving.store import Interaction
from serving.traffic import Decision


class PolicyRoutes:
    """The policy branch of /query (a mixin of serving.app.Ingress)."""

    policy_handle: Any = None

    def _policy_mode(self) -> bool:
        return self.router.traffic.mode == "policy" and self.policy_handle is not None

    async def _answer_policy(self, body: QueryRequest) -> QueryResponse:
        from serving.routes_query import query_features

        t0 = time.perf_counter()
        iid = uuid.uuid4().hex
        category = body.category or "default"
        try:
            res = await self.policy_handle.answer.remote(*body.answer_args(iid))
        except Exception as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, ConfigError):
                raise ApiError(cause.field, cause.message) from None
            d = Decision("policy", "policy", 1.0, None, "request")
            await self._log_failure(iid, body, "policy", "policy", 1.0, category,
                                    features=query_features(body, d), exc=exc, t0=t0)
            raise ApiError("pipeline", f"the policy deployment failed ({type(exc).__name__}); "
                                       f"logged as interaction {iid} with error=1", 502) from None
        pick = res["policy"]
        d = Decision(pick["config_hash"], "policy", float(pick["propensity"]), None, "request")
        lat = dict(res["latency_ms"])
        lat["pipeline"] = (time.perf_counter() - t0) * 1000.0
        feats = {**query_features(body, d), "policy_x": pick["features"],
                 "policy_arm_name": pick["arm_name"], "policy_greedy_arm": pick["greedy_arm"]}
        if pick.get("decisions"):  # a cascade: both decisions, each with its propensity
            feats["policy_decisions"] = list(pick["decisions"])
        if pick.get("candidate_id"):  # candidate-aware exploration: whose share it was drawn in
            feats["policy_candidate_id"] = pick["candidate_id"]
            feats["policy_candidate_share"] = pick["candidate_share"]
        row = Interaction(id=iid, question=self._stored(body.question), variant_id=d.variant,
                          route="policy", propensity=d.propensity,
                          answer=self._stored(res["answer"]), category=category,
                          features=feats, context_ids=res["context_ids"],
                          citations=res["citations"], latency_ms=lat,
                          tokens_in=res["tokens_in"], tokens_out=res["tokens_out"],
                          scores=self._scores(res, body.question),
                          policy_id=pick["policy_id"], arm=int(pick["arm"]),
                          features_hash=pick["features_hash"])
        t1 = time.perf_counter()
        await asyncio.to_thread(self.store.log_interaction, row)  # ack only once committed
        self._score_later(iid, self.policy_handle, res)
        lat["store"] = (time.perf_counter() - t1) * 1000.0
        lat["total"] = (time.perf_counter() - t0) * 1000.0
        self.metrics.observe_answer(d.variant, "policy", lat, res["tokens_in"],
                                    res["tokens_out"], (res["scores"] or {}).get("f1"))
        return QueryResponse(interaction_id=iid, answer=res["answer"],
                             citations=res["citations"], cited_ids=res["cited_ids"],
                             context_ids=res["context_ids"], variant_id=d.variant,
                             route="policy", propensity=d.propensity, latency_ms=lat,
                             tokens_in=res["tokens_in"], tokens_out=res["tokens_out"])
