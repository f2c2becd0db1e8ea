"""The ragpilot Ray Serve application: FastAPI ingress replicas in front of one shared pipeline
deployment that answers for every config variant, with stable/canary/shadow routing, a bandit
mode, a durable interaction log, Prometheus metrics, backpressure and asynchronous tuner
evaluations.

    serve run serving.app:app                       # defaults: synthetic world, extractive
    serve run configs/serve/default.yaml            # the documented settings (HTTP 127.0.0.1)
    ragpilot serve --config configs/serve/default.yaml

HTTP ─► Ingress ×N ─► Router ── stable ─► SharedPipelines (variant id + config per request;
          │                  ├─ canary ─►  indexes and models loaded once per replica,
          │                  └─ mirror ─►  autoscaled: serving.shared_pipelines)
          └─ store: interaction log, routing rows, feedback, rate-limit buckets

Endpoints: POST /query, POST /feedback, GET /rl/stats, GET /rl/leaderboard,
POST /tuner/evaluate, GET /tuner/jobs/{id}, POST|GET /admin/traffic, GET /metrics, GET /healthz (alive), GET /readyz (ready),
OpenAPI at /docs. Hardening (docs/serving.md): /admin/*, /tuner/* need an `admin` API key
(serving.auth; /rl/* a `read` key when `auth.protect_reads`), bodies over
`limits.max_body_bytes` get 413 before parsing, PII is redacted from logs (serving.pii), and a
failed pipeline call is logged as an interaction with `error=1`. `local_app` runs the same
ingress in-process without Ray (ASGI: the fuzz and crash tests).

Scale-out (`ingress.replicas`, default 1; configs/serve/default.yaml: 2): routing, bandit
statistics and rate limits live in the store, so any replica answers the same
(serving.replica_sync, serving.shared_limits). Per replica: the in-flight gate
(`limits.max_inflight` each), tuner jobs (GET /tuner/jobs/{id} answers on the replica that
took the job) and Prometheus counters (each replica publishes its own to the store, and
`GET /metrics` on any replica serves all of them, labelled `replica`: serving.metrics). Variants are declared in the
Serve args (stable/canary/shadow/bandit.arms) and changed through Serve's own config update
(`serve deploy` / `serve run` of the edited YAML, or `serving.launch.update_app` from the
driver): the shared deployment's args do not name variants. A variant added at run time
(POST /admin/traffic with config overrides) is written to the store as the desired split; each
ingress replica's reconciler adopts it (no `serve.run` in a replica). On restart the interaction log is replayed into the bandits and its `routing` rows
bring back the last run-time split (serving.routing_state).

Routes by concern: serving.routes_query (/query, /feedback), serving.routes_admin (/rl/*,
/admin/*), serving.routes_tuner (/tuner/*), serving.routes_ops (/metrics, /healthz, /readyz); the FastAPI
object, error bodies and middleware in serving.api. This module composes them into `Ingress`
and builds the application (`build_app`, or `local_app` in-process).
"""

# No `from __future__ import annotations` here: FastAPI must see real classes in the route
# signatures after Ray pickles the ingress class into its replica (forward refs break OpenAPI).
import asyncio
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from ray import serve

from rag.config import RAGConfig
from rag.env import configure_runtime_env
from rag.errors import ConfigError, DataError
from serving.api import api, log, replica_id
from serving.auth import Guard, KeyFile, install_guard
from serving.jobs import TunerJobs, run_evaluation
from serving.limits import InflightGate, TokenBucketLimiter, set_body_limit
from serving.metrics import MetricsPublisher, ServeMetrics, install_metrics
from serving.pii import RedactingFilter
from serving.pipelines import deployment_options
from serving.policy_router import POLICY_HANDLE, bind_policy
from serving.replica_sync import ReplicaSync
from serving.request_log import RequestLog, install_request_log, log_dir
from serving.routes_admin import AdminRoutes
from serving.routes_ops import OpsRoutes
from serving.routes_policy import PolicyRoutes
from serving.routes_query import QueryRoutes, query_features  # noqa: F401 - re-exported
from serving.routes_tuner import TunerRoutes
from serving.routing_state import peek, restorable, restored_configs, yaml_fingerprint
from serving.schemas import (
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
from serving.shared_limits import StoreTokenBucket
from serving.shared_pipelines import VariantHandle, bind_shared
from serving.store import open_store
from serving.traffic import TrafficSplitter

_STATE: dict[str, Any] = {}


@serve.deployment(name="Ingress", num_replicas=1)
@serve.ingress(api)
class Ingress(QueryRoutes, PolicyRoutes, AdminRoutes, TunerRoutes, OpsRoutes, ReplicaSync):
    """Routes, logs and measures; the pipelines run in the shared pipeline deployment (and a
    per-query policy, when configured, in its own `Policy` deployment)."""

    def __init__(self, settings: dict[str, Any], handles: dict[str, Any],
                 roles: dict[str, str | None], configs: dict[str, dict[str, Any]],
                 shared: Any = None):
        """`handles`: variant id -> handle with `answer`/`info` (ignored when `shared`, the
        handle of the SharedPipelines deployment, is given: each variant is then a
        VariantHandle over it); `roles`: stable/canary/shadow -> variant id; `configs`:
        variant id -> its RAGConfig as JSON."""
        configure_runtime_env()
        self.settings = ServeSettings.from_args(settings)
        s = self.settings
        self._shared = shared
        handles = dict(handles)
        self.policy_handle = handles.pop(POLICY_HANDLE, None)  # serving.routes_policy
        self.configs = dict(configs)
        self.handles = ({h: VariantHandle(shared, h, c) for h, c in self.configs.items()}
                        if shared is not None else dict(handles))
        self.store = open_store(s.store_url)
        self.metrics = ServeMetrics(max_variants=s.max_variants)
        _STATE["metrics"] = self.metrics
        install_metrics(self.metrics)
        self.publisher = MetricsPublisher(self.store, self.metrics, replica_id(),
                                          s.ingress.metrics_interval_s).start()
        self.request_log = (RequestLog(log_dir(s.logs.dir, s.store_url), replica_id(), s.logs.sample_rate,
                                       s.logs.max_bytes, s.logs.backups)
                            if s.logs.enabled else None)
        install_request_log(self.request_log)
        set_body_limit(s.limits.max_body_bytes)
        self.guard = Guard(KeyFile(s.auth.keys_file), s.auth.enabled, s.auth.protect_reads)
        install_guard(self.guard)
        if s.pii.redact_logs and not any(isinstance(f, RedactingFilter) for f in log.filters):
            log.addFilter(RedactingFilter(s.pii.kinds))
        explicit = [s.config(a).config_hash for a in s.bandit.arms]
        self.router = TrafficSplitter(roles["stable"] or "", s.traffic, s.bandit, canary=roles["canary"],
                             shadow=roles["shadow"], arms=explicit or list(self.handles))
        self._explicit_arms = bool(explicit)
        self._routing_fp = yaml_fingerprint(s, roles)
        self.restored = self._restore_routing(restorable(self.store, s, roles))
        self._init_sync()  # replays the stored bandit feedback (serving.replica_sync)
        self.limiter = (StoreTokenBucket(s.store_url, s.limits.rate_per_s, s.limits.burst)
                        if s.ingress.replicas > 1 else
                        TokenBucketLimiter(s.limits.rate_per_s, s.limits.burst,
                                           s.limits.max_clients))
        self.gate = InflightGate(s.limits.max_inflight)
        self.jobs = TunerJobs(self._submit_eval, s.max_jobs, on_done=self._job_done,
                              store=self.store)
        self.gates: dict[str, dict[str, bool]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._signal_tasks: set[asyncio.Task] = set()  # serving.routes_query._score_later
        self._signals_skipped = 0
        self._deploy_lock = asyncio.Lock()
        self.metrics.set_traffic(self.router.traffic.canary_percent,
                                 self.router.traffic.shadow_percent)

    # ---- routes: declared here, handled by the mixins -------------------------------------------
    # Ray Serve pickles this class by value into the replica together with the FastAPI app; an
    # endpoint defined in an importable mixin would be pickled by reference and lose the `self`
    # injection Serve adds to its signature (FastAPI then asks for `self` as a query parameter).
    @api.post("/query", response_model=QueryResponse)
    async def query(self, body: QueryRequest, request: Request) -> QueryResponse:
        """Route, answer, log and measure one question (serving.routes_query)."""
        return await self._query(body, request)

    @api.post("/feedback")
    async def feedback(self, body: FeedbackRequest, request: Request) -> dict[str, Any]:
        """Store the user's reward; the bandit learns it minus the PII-leak penalty."""
        return await self._feedback(body, request)

    @api.get("/rl/stats")
    async def stats(self) -> dict[str, Any]:
        return await self._stats()

    @api.get("/rl/leaderboard")
    async def leaderboard(self, category: str | None = None) -> dict[str, Any]:
        return await self._leaderboard(category)

    @api.get("/admin/traffic")
    async def get_traffic(self) -> dict[str, Any]:
        return await self._get_traffic()

    @api.get("/admin/rollout")
    async def rollout_status(self) -> dict[str, Any]:
        return await self._rollout_status()

    @api.post("/admin/rollout/start")
    async def rollout_start(self, body: RolloutStartRequest) -> dict[str, Any]:
        return await self._rollout_start(body)

    @api.post("/admin/rollout/advance")
    async def rollout_advance(self, body: RolloutAdvanceRequest) -> dict[str, Any]:
        """Add evidence (reports, or the interaction log), then try one stage up."""
        return await self._rollout_advance(body)

    @api.post("/admin/rollout/rollback")
    async def rollout_rollback(self, body: RolloutRollbackRequest) -> dict[str, Any]:
        return await self._rollout_rollback(body)

    @api.post("/admin/traffic")
    async def set_traffic(self, body: TrafficRequest) -> dict[str, Any]:
        return await self._set_traffic(body)

    @api.post("/tuner/evaluate", status_code=202)
    async def tuner_evaluate(self, body: EvaluateRequest) -> dict[str, Any]:
        return await self._tuner_evaluate(body)

    @api.get("/tuner/jobs/{job_id}")
    async def tuner_job(self, job_id: str) -> dict[str, Any]:
        return await self._tuner_job(job_id)

    @api.get("/metrics")
    async def metrics_endpoint(self) -> Response:
        return await self._metrics_endpoint()

    @api.get("/healthz")
    async def healthz(self) -> JSONResponse:
        """Liveness: 200 `alive` whenever this ingress replica answers (nothing else is
        checked: that is /readyz)."""
        return await self._healthz()

    @api.get("/readyz")
    async def readyz(self) -> JSONResponse:
        """Readiness: 200 once the store and every deployment answer (2 s each at most);
        else 503 JSON with `status` `starting`, `unavailable` or `draining` (the server is
        stopping: serving.drain), `error` and `failed`."""
        return await self._readyz()



def _resolved(s: ServeSettings) -> ServeSettings:
    """Relative store and key-file paths resolved against the current directory (replicas
    run elsewhere)."""
    if "://" not in s.store_url:
        s = s.model_copy(update={"store_url": str(Path(s.store_url).resolve())})
    keys = str(Path(s.auth.keys_file).resolve())
    logs = s.logs.model_copy(update={"dir": log_dir(s.logs.dir, s.store_url)})
    return s.model_copy(update={"auth": s.auth.model_copy(update={"keys_file": keys}),
                                "logs": logs})


def preflight(args: dict[str, Any] | None = None) -> ServeSettings:
    """ServeSettings of `args`, checked before anything starts: the settings (ConfigError
    naming the field) and a served `index_dir` (it must be an index directory, built from
    `dataset`'s corpus when that is named: `serving.pipelines.check_served_data`), which every
    replica would otherwise refuse one by one while Serve retries them. `ragpilot serve` calls
    it before Ray starts."""
    s = _resolved(ServeSettings.from_args(args))
    _check_paths(s)
    if s.index_dir:
        from serving.pipelines import check_served_data

        try:
            check_served_data(s.dataset, s.index_dir, s.indexes)
        except DataError as exc:  # name the setting, not only the path
            raise ConfigError("serve.index_dir", str(exc)) from None
    return s


def _check_paths(s: ServeSettings) -> None:
    """The files and folders the app will open, checked before Ray starts (each was a raw
    OSError or sqlite3 error inside a replica, or nothing at all until a request): the store,
    the key file, the rollout directory, the policy directories."""
    from rl.routing.base import MODEL_FILE, POLICY_FILE
    from serving.store import check_store_url

    check_store_url(s.store_url, "serve.store_url")
    if Path(s.auth.keys_file).is_dir():
        raise ConfigError("serve.auth.keys_file", f"{s.auth.keys_file} is a directory")
    if Path(s.rollout_dir).exists() and not Path(s.rollout_dir).is_dir():
        raise ConfigError("serve.rollout_dir", f"{s.rollout_dir} is a file, not a directory")
    if s.policy is not None:
        for field, d in (("dir", s.policy.dir), ("candidate_dir", s.policy.candidate_dir)):
            if d is not None and not all((Path(d) / f).is_file()
                                         for f in (POLICY_FILE, MODEL_FILE)):
                raise ConfigError(f"serve.policy.{field}", f"{d} is not a policy directory "
                                  f"({POLICY_FILE} and {MODEL_FILE}; `ragpilot router train` "
                                  "writes one)")


def build_app(args: dict[str, Any] | None = None):
    """The application for `args` (ServeSettings as a mapping; what the YAML's `args:` holds),
    after `preflight`. A relative `store_url` path is resolved against the current directory."""
    configure_runtime_env()
    s = preflight(args)
    roles, configs = _variants(s)
    p = s.pipelines
    opts = deployment_options(p.num_cpus, p.max_ongoing_requests, p.num_replicas,
                              p.autoscaling)
    logs = {"logging_config": {"enable_access_log": s.access_log}}
    opts.update(logs)
    # warm-up with the base config only: the shared deployment's args then do not change
    # when only the declared variants do (nothing in them asks Serve to reload the indexes)
    shared = bind_shared(s.dataset, s.index_dir, opts, s.indexes, s.max_variants,
                         [s.config({}).model_dump(mode="json")])
    handles = {POLICY_HANDLE: bind_policy(s, opts)} if s.policy is not None else {}
    return Ingress.options(ray_actor_options={"num_cpus": s.ingress_num_cpus},
                           num_replicas=s.ingress.replicas, **logs,
                           max_ongoing_requests=s.limits.max_inflight + 64).bind(
        s.model_dump(mode="json"), handles, roles,
        {h: c.model_dump(mode="json") for h, c in configs.items()}, shared)


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
    `service.answer(q, iid)` in a thread (any object with `answer` and `info`; `signals` too
    when the service has it)."""

    def __init__(self, service: Any):
        self.service = service
        self.answer = _LocalMethod(service.answer)
        self.info = _LocalMethod(service.info)
        if hasattr(service, "signals"):
            self.signals = _LocalMethod(service.signals)


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
    if s.policy is not None:
        from serving.policy_router import PolicyService

        handles[POLICY_HANDLE] = LocalHandle(services.get(POLICY_HANDLE) or PolicyService(
            s.policy.dir, s.dataset, s.index_dir, s.policy.epsilon, s.policy.seed,
            indexes=s.indexes, candidate_dir=s.policy.candidate_dir,
            candidate_share=s.policy.candidate_share))
    # the class defined above: the first base of Serve's ASGI wrapper with its own __init__
    cls = next(b for b in Ingress.func_or_class.__mro__[1:] if "__init__" in b.__dict__)
    inst = cls.__new__(cls)
    cls.__init__(inst, s.model_dump(mode="json"), handles, roles,
                 {h: c.model_dump(mode="json") for h, c in configs.items()})
    pool = ThreadPoolExecutor(1, thread_name_prefix="tuner-job")
    inst.jobs = TunerJobs(submit or (lambda req: pool.submit(run_evaluation, req)),
                          s.max_jobs, on_done=inst._job_done, store=inst.store)
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
