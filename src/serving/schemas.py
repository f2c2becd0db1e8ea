"""Typed settings of the Serve application and the JSON bodies of its endpoints.

`ServeSettings` is what `configs/serve/default.yaml` passes as the application's `args` (and what
`serving.app.build_app` validates): an unknown key or a bad value is an error naming the key
(`serve.traffic.canary_percent: ...`). Configs are RAGConfig *overrides* on top of `base`, so a
YAML file only names what differs (e.g. `canary: {variant: bm25}`).

Units: percentages in [0, 100]; rates in requests per second; times in seconds unless a name
ends in `_ms`; rewards in [0, 1].
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rag.config import RAGConfig
from rag.corpus.loaders import BUILTIN_DATASETS
from rag.errors import RagError
from rag.settings_base import StrictSettings
from rl.kernel.reward import PII_LEAK_WEIGHT
from rl.promotion.service import ID_CHARS


class ApiError(RagError):
    """A request the API refuses: `field` names the offending request field, `status` is the
    HTTP code (404 unknown id, 409 conflict, 422 invalid value, 429 with `headers`
    Retry-After)."""

    def __init__(self, field: str, message: str, status: int = 422,
                 headers: dict[str, str] | None = None):
        self.field, self.message, self.status = field, message, status
        self.headers = headers
        super().__init__(f"{field}: {message}")


# ---- settings ---------------------------------------------------------------------------------
class TrafficSettings(StrictSettings):
    """How requests are split. `split`: stable/canary by percentage (+ shadow mirroring);
    `bandit`: every request picks an arm with a per-category UCB1 or Thompson bandit;
    `policy`: the per-query policy deployment picks the config (`policy:`, serving.policy_router)."""

    mode: Literal["split", "bandit", "policy"] = "split"
    canary_percent: float = Field(0.0, ge=0.0, le=100.0)
    shadow_percent: float = Field(0.0, ge=0.0, le=100.0)
    sticky: Literal["user", "session", "request"] = "user"
    """Hash key of the canary assignment: user_id (then session_id, then the interaction id),
    session_id (then the interaction id), or the interaction id alone."""
    salt: str = "ragpilot"
    """Changing the salt reshuffles which users land on the canary."""


class BanditSettings(StrictSettings):
    algorithm: Literal["ucb1", "thompson"] = "ucb1"
    c: float = Field(1.41421356, ge=0.0)
    """UCB1 exploration constant."""
    prior_mean: float = 0.5
    prior_sd: float = Field(0.5, gt=0.0)
    noise_sd: float = Field(0.25, gt=0.0)
    """Thompson: Gaussian prior on each arm's mean reward and known reward noise."""
    arms: list[dict[str, Any]] = Field(default_factory=list)
    """RAGConfig overrides, one per arm; empty = the stable and candidate configs."""
    max_categories: int = Field(32, ge=1)
    """Categories beyond this share the bandit of category `other` (bounded state)."""
    seed: int = 0


class PolicyServeSettings(StrictSettings):
    """The per-query policy deployment (serving.policy_router), used when traffic.mode is
    `policy`."""

    dir: str = Field(min_length=1)
    """A policy directory (rl.routing.base.save_policy: policy.json + model.pkl)."""
    epsilon: float = Field(0.1, ge=0.0, le=1.0)
    """Uniform exploration share the user sets: every arm keeps a propensity of at least
    epsilon / M (0: the policy's own probabilities, logged as they are)."""
    candidate_dir: str | None = None
    """A candidate policy directory (same arms, same features) explored beside the served one
    until its off-policy gate: candidate-aware exploration (rl.routing.base.Exploring)."""
    candidate_share: float = Field(0.0, ge=0.0, le=0.5)
    """Share of requests the candidate chooses (on top of the uniform epsilon); its own choices
    are then logged with a propensity of at least this, not epsilon / M."""
    seed: int = 0

    @model_validator(mode="after")
    def _candidate(self):
        if self.candidate_share > 0.0 and not self.candidate_dir:
            raise ValueError("candidate_share > 0 needs candidate_dir")
        if self.candidate_dir and self.candidate_share == 0.0:
            raise ValueError("candidate_dir without candidate_share: the candidate would "
                             "never be explored (set candidate_share, e.g. 0.1)")
        if self.epsilon + self.candidate_share > 1.0:
            raise ValueError(f"epsilon {self.epsilon} + candidate_share "
                             f"{self.candidate_share} must not exceed 1")
        return self


class LimitSettings(StrictSettings):
    max_inflight: int = Field(64, ge=1)
    """Requests on /query being answered at once; one more gets 429 (bounded queue)."""
    rate_per_s: float = Field(50.0, gt=0.0)
    """Token-bucket refill per client, requests/s, shared by /query and /feedback. A client is
    the API key's id when the request carries a valid key, else the connection's address; never
    a body field (a client could change `user_id` per request)."""
    burst: float = Field(100.0, ge=1.0)
    """Token-bucket capacity per client (requests)."""
    max_clients: int = Field(10_000, ge=1)
    """Clients tracked by the rate limiter (least recently seen are forgotten)."""
    max_body_bytes: int = Field(1_048_576, ge=1024, le=64 * 2**20)
    """Request bodies above this are refused with 413 before they are parsed."""
    max_question_chars: int = Field(4000, ge=1, le=4000)
    """/query `question` length (the schema's hard cap is 4,000; this can only lower it)."""
    max_batch_size: int = Field(2000, ge=1, le=100_000)
    """/tuner/evaluate `batch_size` at most (one job's examples)."""
    max_k: int = Field(32, ge=1, le=32)
    """`k` of any config sent to /tuner/evaluate or /admin/traffic at most."""
    trusted_proxies: list[str] = Field(default_factory=list)
    """Addresses or networks (`10.0.0.0/8`) of the proxies in front of the app. A request
    without a valid API key that comes from one of them is rate-limited by the client address
    its `X-Forwarded-For` names (the nearest hop that is not a trusted proxy); from anywhere
    else the header is ignored (a client could write any address there)."""

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        import ipaddress

        for item in v:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network (e.g. 10.0.0.5, "
                                 "10.0.0.0/8)") from None
        return v


class AuthSettings(StrictSettings):
    """API keys for the admin endpoints (serving.auth): `ragpilot keys create --role admin`."""

    enabled: bool = True
    """Off only for local experiments: every admin endpoint is then open."""
    keys_file: str = "runs/serve/api_keys.json"
    """Hashed keys (sha256 with a per-key salt); re-read when it changes."""
    protect_reads: bool = False
    """Also require a `read` (or `admin`) key for /rl/stats and /rl/leaderboard."""


PII_KINDS = Literal["email", "iban", "credit_card", "ssn", "phone"]


class PIISettings(StrictSettings):
    """PII handling (serving.pii)."""

    redact_logs: bool = True
    """Redact PII from the ingress's log records (messages and tracebacks)."""
    redact_store: bool = False
    """Store questions and answers redacted in the interaction log (features and the
    leak count are computed from the raw text first)."""
    kinds: list[PII_KINDS] = Field(
        default_factory=lambda: ["email", "iban", "credit_card", "ssn", "phone"])
    leak_detection: Literal["off", "leak", "any"] = "leak"
    """Count PII in each answer into `scores.pii_leaks`: `leak` = not present in the question,
    `any` = every match."""
    leak_penalty: float = Field(PII_LEAK_WEIGHT, ge=0.0)
    """Reward units subtracted per leak (`rl.kernel.reward.feedback_reward`) from a /feedback reward
    before the bandit learns from it, and from logged rewards used as rollout evidence
    (`from_log`); 0 turns the penalty off."""


class DeploymentSettings(StrictSettings):
    """Ray Serve options of the shared pipeline deployment (serving.shared_pipelines: one
    for every config variant)."""

    num_cpus: float = Field(0.25, ge=0.0)
    max_ongoing_requests: int = Field(8, ge=1)
    num_replicas: int | None = Field(None, ge=1)
    """Fixed replica count; leave unset to use `autoscaling`."""
    autoscaling: dict[str, Any] | None = Field(
        default_factory=lambda: {"min_replicas": 1, "max_replicas": 2,
                                 "target_ongoing_requests": 4})
    """Ray Serve AutoscalingConfig fields (min_replicas, max_replicas, target_ongoing_requests,
    upscale_delay_s, downscale_delay_s, ...)."""


class IngressSettings(StrictSettings):
    """The ingress deployment's replicas and how they share state (serving.replica_sync)."""

    replicas: int = Field(1, ge=1, le=16)
    """Ingress replicas. Routing, bandit statistics and (with more than one) rate limits live
    in the store, so any replica answers the same."""
    sync_interval_s: float = Field(0.2, ge=0.0, le=10.0)
    """At most this long (s) before a replica adopts a sibling's routing change or feedback."""
    metrics_interval_s: float = Field(1.0, gt=0.0, le=60.0)
    """How often (s) each replica writes its metrics snapshot to the store, which every
    replica's `GET /metrics` serves with a `replica` label (serving.metrics)."""


class LogSettings(StrictSettings):
    """The ingress's structured logs (serving.request_log): one JSON line per request and per
    admin action, in a rotating file per replica."""

    enabled: bool = True
    dir: str | None = None
    """Folder of the files `requests-<host>-<pid>.jsonl` (relative: to the working directory
    `ragpilot serve` starts in). Default: `logs/` beside an SQLite store, else
    `runs/serve/logs`."""
    sample_rate: float = Field(1.0, ge=0.0, le=1.0)
    """Share of requests written (5xx answers and admin actions: always)."""
    include_question: bool = False
    """Write the question text too (PII-redacted when `pii.redact_logs`)."""
    max_bytes: int = Field(50_000_000, ge=10_000)
    """Rotate a file at this size."""
    backups: int = Field(5, ge=0, le=100)
    """Rotated files kept per replica."""


class ServeSettings(StrictSettings):
    SECTION = "serve"

    dataset: str | None = None
    """Dataset whose indexes the pipelines serve and whose gold answers score answers and
    shadows (unset: `synthetic`, or no dataset when `index_dir` is given)."""
    index_dir: str | None = None
    """Serve an existing IndexSet directory instead. Alone: no gold (answers and shadows are
    logged, not scored). With `dataset`: the directory must be built from that dataset's corpus
    (checked before Ray starts: a ConfigError naming `serve.dataset`) and its gold scores
    them."""
    indexes: dict[str, Any] | None = None
    """Index-backend overrides every replica applies (`rag.index.settings.IndexSettings`: where
    a backend runs, e.g. `faiss_device: gpu` or the OpenSearch URL; the backend itself is
    pinned by the index directory's manifest). Validated at load, keys named `indexes.*`."""
    store_url: str = "runs/serve/interactions.sqlite"
    """SQLite path (WAL) or an SQLAlchemy URL (postgresql://...)."""
    base: dict[str, Any] = Field(default_factory=lambda: {"generator": "extractive"})
    stable: dict[str, Any] = Field(default_factory=dict)
    canary: dict[str, Any] | None = None
    shadow: dict[str, Any] | None = None
    traffic: TrafficSettings = TrafficSettings()
    bandit: BanditSettings = BanditSettings()
    policy: PolicyServeSettings | None = None
    """Deploy a per-query policy (serving.policy_router); serves when traffic.mode is policy."""
    limits: LimitSettings = LimitSettings()
    auth: AuthSettings = AuthSettings()
    pii: PIISettings = PIISettings()
    pipelines: DeploymentSettings = DeploymentSettings()
    max_variants: int = Field(8, ge=1, le=64)
    """Config variants (hashes) served at most; also bounds the Prometheus variant label and
    each shared replica's cache of per-variant pipeline views."""
    ingress_num_cpus: float = Field(0.25, ge=0.0)
    ingress: IngressSettings = IngressSettings()
    logs: LogSettings = LogSettings()
    eval_num_cpus: float = Field(0.0, ge=0.0)
    """CPUs reserved by a /tuner/evaluate Ray task (0: runs beside the replicas)."""
    max_jobs: int = Field(256, ge=1)
    """Finished tuner jobs kept in memory (oldest forgotten first)."""
    eval_datasets: list[str] = Field(default_factory=lambda: list(BUILTIN_DATASETS))
    """What `POST /tuner/evaluate` may read as its `dataset`: built-in names, dataset files and
    folders (a folder allows everything under it), paths relative to the server's working
    directory. `dataset` above is always allowed. Anything else is refused with 403
    `dataset`: the endpoint would otherwise read any file the server can (`allows_eval`)."""
    restore_routing: bool = True
    """At start-up, serve the split last set at run time (`/admin/traffic`, `/admin/rollout/*`;
    kept in the store) when these args' stable/canary/shadow/traffic are unchanged since;
    false: always serve the args (serving.routing_state)."""
    access_log: bool = False
    """Ray Serve's access log (one INFO line per request in the proxy and in every replica it
    passes). Off by default: the interaction log and the Prometheus counters already record
    every request, and each line is formatted, written to a file and to stderr, where Ray's
    log monitor tails it and publishes it through the GCS (~3-5 ms CPU per request over those
    processes at 16 clients). Warnings and errors are logged either way."""
    rollout_dir: str = "runs/rollout"
    """State and audit log of the promotion state machine (`/admin/rollout/*`, the same
    directory `ragpilot rollout --state-dir` uses)."""

    @model_validator(mode="after")
    def _configs_valid(self) -> ServeSettings:
        self.config({}, where="serve.base")  # a bad key of `base` is `base`'s, not stable's
        for name in ("stable", "canary", "shadow"):
            over = getattr(self, name)
            if over is not None:
                self.config(over, where=f"serve.{name}")
        for i, arm in enumerate(self.bandit.arms):
            self.config(arm, where=f"serve.bandit.arms.{i}")
        if self.traffic.mode == "policy" and self.policy is None:
            raise ValueError("traffic.mode policy needs a `policy:` section (policy.dir)")
        return self

    def allows_eval(self, dataset: str) -> bool:
        """Whether `POST /tuner/evaluate` may read `dataset` (`eval_datasets`, plus the served
        `dataset`). A built-in name matches only itself; a path is resolved (symlinks and `..`
        included) and must be an allowed path or lie under an allowed folder, so a listed
        folder cannot be left through `../` or a link."""
        allowed = [*self.eval_datasets, *([self.dataset] if self.dataset else [])]
        if dataset in BUILTIN_DATASETS:
            return dataset in allowed
        target = Path(dataset).resolve()
        for entry in allowed:
            if entry in BUILTIN_DATASETS:
                continue
            root = Path(entry).resolve()
            if target == root or (root.is_dir() and target.is_relative_to(root)):
                return True
        return False

    def config(self, overrides: dict[str, Any], where: str = "config") -> RAGConfig:
        """`base` + `overrides` as a validated RAGConfig (errors name `where.<key>`)."""
        return RAGConfig.from_dict({**self.base, **overrides}, where=where)

    @classmethod
    def from_args(cls, args: dict[str, Any] | None) -> ServeSettings:
        """Validate the application args; errors are ConfigError naming `serve.<key>`."""
        from rag.index.settings import IndexSettings

        if isinstance(args, dict) and args.get("indexes") is not None:
            IndexSettings.from_dict(args["indexes"], where="serve.indexes")
        return cls.from_mapping(args or {})


# ---- request / response bodies ------------------------------------------------------------------
MAX_TURNS = 50
"""Earlier turns a query may carry (`QueryRequest.history`)."""


def _valid_json(value: Any) -> None:
    """Raise ValueError for a lone surrogate (JSON's `\\ud800`: Python decodes it, but it
    cannot be stored, logged or answered as UTF-8) or a non-finite number (NaN, Infinity,
    1e999) anywhere in `value`, nested config mappings included."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("is not valid Unicode (a lone surrogate)") from None
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"holds {value!r}: numbers must be finite")
    elif isinstance(value, dict):
        for k, v in value.items():
            _valid_json(k)
            _valid_json(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _valid_json(v)


class RequestBody(StrictSettings):
    """A request body: unknown keys refused (StrictSettings), no coercion (`"0.5"` or `true`
    is not a number, `"yes"` not a boolean), finite numbers only (JSON's NaN, Infinity and
    1e999 are refused, inside config mappings too) and valid Unicode, each as a 422 naming
    the field."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _finite_and_unicode(cls, v: Any) -> Any:
        _valid_json(v)
        return v


class Turn(RequestBody):
    """One earlier turn of a conversation: who spoke and what."""

    role: Literal["user", "agent", "assistant"]
    text: str = Field(max_length=4000)


class QueryRequest(RequestBody):
    question: str = Field(min_length=1, max_length=4000)
    user_id: str | None = Field(None, max_length=200)
    session_id: str | None = Field(None, max_length=200)
    category: str | None = Field(None, max_length=64)
    history: list[Turn] | None = Field(None, max_length=MAX_TURNS)
    """The conversation's earlier turns, oldest first: a pipeline whose config sets
    `query_formulation` retrieves with them (`rag.query_formulation`), and a per-query policy
    trained on conversations reads them (`rl.routing.features`). None or []: a single turn."""

    def turns(self) -> tuple[dict[str, str], ...]:
        """`history` as the pipeline takes it ((), without one)."""
        return tuple(t.model_dump() for t in self.history or ())

    def answer_args(self, query_id: str) -> tuple:
        """The positional arguments of a replica's `answer` for this request: (question, id)
        plus the turns when there are any (so single-turn calls keep their two arguments)."""
        turns = self.turns()
        return (self.question, query_id, turns) if turns else (self.question, query_id)

    @field_validator("question")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must contain a non-space character")
        return v


class QueryResponse(BaseModel):
    interaction_id: str
    answer: str
    citations: list[int]
    """1-based indices into `context_ids`."""
    cited_ids: list[str]
    context_ids: list[str]
    variant_id: str
    """Config hash of the pipeline that answered."""
    route: str
    """stable | canary | bandit | policy."""
    propensity: float
    """Probability with which this variant was chosen for this request."""
    latency_ms: dict[str, float]
    """Per pipeline stage, plus `pipeline` (replica call), `store` (commit), `total` (ingress)."""
    tokens_in: int
    tokens_out: int


class FeedbackRequest(RequestBody):
    interaction_id: str = Field(min_length=1, max_length=64)
    reward: float = Field(ge=0.0, le=1.0)
    """User-perceived quality in [0, 1]."""


class TrafficRequest(RequestBody):
    """Any field left out keeps its current value; a config is RAGConfig overrides on top of
    `base` or the variant id (config hash) of a deployed pipeline; null removes it (not for
    `stable`: something must serve)."""

    mode: Literal["split", "bandit", "policy"] | None = None
    canary_percent: float | None = Field(None, ge=0.0, le=100.0)
    shadow_percent: float | None = Field(None, ge=0.0, le=100.0)
    canary_config: dict[str, Any] | str | None = None
    shadow_config: dict[str, Any] | str | None = None
    stable: dict[str, Any] | str | None = None
    """The config answering every request not sent to the canary (e.g. the old stable after a
    rollback from `full`); validated and deployed like `canary_config`."""


ID_PATTERN = rf"^{ID_CHARS}+$"
"""A variant or manifest id (`rl.promotion.service.ID_CHARS`; the lengths are the fields')."""


class RolloutStartRequest(RequestBody):
    candidate: str = Field(min_length=1, max_length=64, pattern=ID_PATTERN)
    """Variant id (config hash) of a deployed pipeline to promote."""
    stable: str | None = Field(None, min_length=1, max_length=64, pattern=ID_PATTERN)
    """Variant id it is compared with (default: the router's stable)."""
    manifest_id: str = Field("unknown", min_length=1, max_length=128, pattern=ID_PATTERN)
    force: bool = False
    """Replace an unfinished rollout."""


class RolloutAdvanceRequest(RequestBody):
    reports: list[dict[str, Any]] = Field(default_factory=list, max_length=1000)
    """EvaluationReport objects (rl.promotion.evaluators) to observe before trying to advance."""
    from_log: bool = False
    """Also build the stage's report from this app's interaction log (rows since the last
    batch counted)."""


class RolloutRollbackRequest(RequestBody):
    reason: str = Field(min_length=1, max_length=500)


class EvaluateRequest(RequestBody):
    config: dict[str, Any] = Field(default_factory=dict)
    """RAGConfig overrides on top of the app's `base`."""
    dataset: str = "synthetic"
    split: str | None = None
    batch_size: int | None = Field(None, ge=1, le=100_000)
    seed: int = 0
    allow_missing_gold: bool = False
    """Evaluate even when more than half of the split's questions have no gold in the corpus
    (otherwise the job fails naming the problem; fewer are counted in the report's
    `warnings`)."""
