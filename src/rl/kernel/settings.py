"""The tuner's policy configuration: what it may change, what it must not break, what it wants.

`configs/rl/tuner.yaml` documents every key; `TunerSettings.from_yaml` validates a file
at load time and names the offending key (`policy.bounds.k.min: ...`). A file only needs the
keys it changes: everything else takes the documented default.

The heads of the config space (`rl.kernel.space.ConfigSpace`; the defaults hold > 10^6 distinct
configs). A head acts only where noted; elsewhere it is canonicalised so equal configs hash equal.
A head is pinned by listing one value (Discrete) or by min == max (Box).
    variant       Discrete over `discrete.variant` labels: a retriever name (bm25, dense, hybrid,
                  graph) or a label defined under `variants:` (RAGConfig overrides, e.g. A/B arms)
    k             Discrete over `k_grid` (RLlib rejects integer Boxes), clipped to `bounds.k`;
                  `k_grid: null` (the default) = every integer in `bounds.k`
    rerank        Discrete(2) over `discrete.rerank` ([off, on]); "on" means `reranker`
    fusion_weight Box within `bounds.fusion_weight` (snapped to `fusion_step`); hybrid only
    normalisation Discrete over `discrete.normalisation`; hybrid only
    mmr_lambda    Box within `bounds.mmr_lambda` (snapped to `mmr_step`); 1.0 = no MMR
    rerank_depth  Discrete over `discrete.rerank_depth`, raised to k (and capped at the
                  candidates); rerank on only
    rerank_mix    Box within `bounds.rerank_mix` (snapped to `rerank_mix_step`; 1.0 = the
                  reranker's order, stored as None); rerank on only
    prompt_id     Discrete over `discrete.prompt_id`
    abstain_threshold Box within `bounds.abstain_threshold` (snapped to `abstain_step`); only
                  with an `*_abstain` prompt and the extractive generator
    query_formulation Discrete over `discrete.query_formulation`; conversational data only
    context_budget Discrete over `discrete.context_budget`: tokens kept per passage (null =
                  whole passages; `rag.generation.context`)
    generator     Discrete over `discrete.generator` (registry names); null = the base config's
Heads override what a `variants:` label sets for the same field (except `generator: null`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    SerializationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from rag.config import MAX_CANDIDATES, Normalisation, QueryFormulation, RAGConfig
from rag.errors import ConfigError
from rag.generation.extractive import ExtractiveReader
from rag.resources import default_config
from rag.settings_base import StrictSettings, YamlSource
from rl.common.ppo_settings import TUNER_PPO, PPOSettings

RETRIEVERS = ("bm25", "dense", "hybrid", "graph")
LEGACY_K_GRID = (3, 4, 5, 6, 8, 12, 16, 24, 32)
"""The k grid of the small space (`TunerSettings.with_legacy_space`)."""
DEFAULTS_PATH = default_config("rl/tuner.yaml")
"""The documented defaults, shipped in the wheel (`rag.resources`)."""


class IntRange(StrictSettings):
    min: int
    max: int

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class FloatRange(StrictSettings):
    min: float
    max: float

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class Bounds(StrictSettings):
    k: IntRange = IntRange(min=1, max=32)
    fusion_weight: FloatRange = FloatRange(min=0.0, max=1.0)
    mmr_lambda: FloatRange = FloatRange(min=0.0, max=1.0)
    rerank_mix: FloatRange = FloatRange(min=0.25, max=1.0)
    """0 would keep the retrieval order while paying for the reranker: a no-op choice."""
    abstain_threshold: FloatRange = FloatRange(min=0.1, max=1.0)
    """0 never abstains: the same answers as the prompt without `_abstain` (a no-op choice)."""

    @model_validator(mode="after")
    def _inside(self) -> Bounds:
        if self.k.min < 1 or self.k.max > 32:
            raise ValueError("k bounds must lie within [1, 32]")
        for name in ("fusion_weight", "mmr_lambda", "rerank_mix", "abstain_threshold"):
            r = getattr(self, name)
            if r.min < 0.0 or r.max > 1.0:
                raise ValueError(f"{name} bounds must lie within [0, 1]")
        return self


class Discrete(StrictSettings):
    variant: tuple[str, ...] = RETRIEVERS
    rerank: tuple[Literal["off", "on"], ...] = ("off", "on")
    prompt_id: tuple[str, ...] = ("cite_concise", "cite_concise_abstain")
    normalisation: tuple[Normalisation, ...] = ("minmax", "zscore", "rrf")
    rerank_depth: tuple[Annotated[int, Field(ge=1, le=MAX_CANDIDATES)], ...] = (10, 20, 30, 50)
    query_formulation: tuple[QueryFormulation, ...] = ("last_turn", "last_two_user", "all_user")
    generator: tuple[str, ...] | None = None
    """Registry names; None = the base config's generator (extractive), so benches stay cheap."""
    context_budget: tuple[Annotated[int, Field(ge=1, le=1024)] | None, ...] = (None,)
    """Tokens kept per passage (None: whole passages); one value pins the head."""

    @field_validator("rerank", mode="before")
    @classmethod
    def _yaml_bools(cls, v: Any) -> Any:
        # YAML 1.1 reads a bare `off` / `on` as false / true
        if isinstance(v, (list, tuple)):
            return [("on" if x else "off") if isinstance(x, bool) else x for x in v]
        return v

    @model_validator(mode="after")
    def _non_empty(self) -> Discrete:
        for name in ("variant", "rerank", "prompt_id", "normalisation", "rerank_depth",
                     "query_formulation", "generator", "context_budget"):
            vals = getattr(self, name)
            if vals is None and name == "generator":
                continue
            if not vals:
                raise ValueError(f"{name} needs at least one choice")
            if len(set(vals)) != len(vals):
                raise ValueError(f"{name} has duplicate choices")
        return self


class Thresholds(StrictSettings):
    """Hard gates: a config is never promoted when one fails."""

    faithfulness: float = Field(0.75, ge=0.0, le=1.0)
    relevancy: float = Field(0.75, ge=0.0, le=1.0)
    p95_latency_ms: float = Field(500.0, gt=0.0)


class RewardWeights(StrictSettings):
    """r = αF + βR − γ·min(p95/T, 2) − δ·min(cost/C_ref, 2) − λ·P."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    alpha: float = Field(0.5, ge=0.0)
    beta: float = Field(0.5, ge=0.0)
    gamma: float = Field(0.2, ge=0.0)
    delta: float = Field(0.2, ge=0.0)
    lambda_: float = Field(1.0, ge=0.0, alias="lambda")


class Episode(StrictSettings):
    length: int = Field(10, ge=1, le=1000)
    """Steps (config evaluations) per episode."""
    batch_size: int = Field(200, ge=1, le=100_000)
    """Validation queries per step (sampled without replacement; capped at the slice size)."""


class DatasetSlice(StrictSettings):
    """Which split the tuner optimises on, which it reports on, and which per-query metrics
    play faithfulness (F) and relevancy (R) for this dataset."""

    tune_split: str = "valid"
    holdout_split: str = "test"
    faithfulness: str = "support"
    relevancy: str = "f1"
    thresholds: Thresholds | None = None
    """Dataset-specific gates; the global `thresholds` when absent."""

    @classmethod
    def for_gold(cls, kind: str) -> DatasetSlice:
        """The default F and R for data with gold of `kind` (`rl.common.data.TuningData.
        gold_kind`), used for a dataset `policy.datasets` does not name: answers (QA) ->
        support / f1; qrels (retrieval-only) -> sig_combined (the reference-free answer
        signal, rag.metrics.signals: the answer layer has no gold) / ndcg@10; gold passage ids
        only -> sig_combined / recall@10; none -> sig_faithfulness / sig_relevancy."""
        metrics = {"answers": ("support", "f1"), "qrels": ("sig_combined", "ndcg@10"),
                   "passages": ("sig_combined", "recall@10"),
                   "none": ("sig_faithfulness", "sig_relevancy")}
        if kind not in metrics:
            raise ValueError(f"gold kind must be one of {', '.join(metrics)}, got {kind!r}")
        f, r = metrics[kind]
        return cls(faithfulness=f, relevancy=r)


class Budgets(StrictSettings):
    """Ceilings of the `max_quality` objective; None = the incumbent's own value (the pick is
    never costlier or slower than what is served now)."""

    tokens: float | None = Field(None, gt=0.0)
    """Tokens per query (in + out)."""
    cost_per_1k_queries: float | None = Field(None, gt=0.0)
    """Money per 1,000 queries, priced at `Objective.price_per_1k_tokens` (the same currency)."""
    p95_latency_ms: float | None = Field(None, gt=0.0)
    """95th-percentile latency, ms."""


class Objective(StrictSettings):
    """What the tuner's operating point is chosen for, stated as a user states it
    (`rl.kernel.objective.choose`):

        min_cost     the cheapest config (tokens per query) whose quality is non-inferior to
                     the incumbent's: the one-sided `level` lower bound of the paired
                     difference is >= -`margin`, for the quality q = (αF + βR)/(α + β) and for
                     each of F and R that has no floor;
        max_quality  the config with the highest lower bound of paired Δq > 0 within
                     `budgets` (tokens or cost per 1k queries, p95 ms; unset = the
                     incumbent's), F and R each non-inferior as above;
        reward       the seed's weighted scalar reward (`reward_weights`, `thresholds`): the
                     search's best config, gated as before.

    Gates of min_cost and max_quality: an absolute floor applies to a quality metric only when
    `quality_floors` names that metric (the seed's 0.75 to the RAGAS-style faithfulness and
    answer relevancy); every other quality metric is gated by non-inferiority; latency (the
    dataset's `thresholds.p95_latency_ms`) and the error rate (`error_rate_slo`, where rows
    record errors) are SLOs."""

    kind: Literal["min_cost", "max_quality", "reward"] = "min_cost"
    margin: float = Field(0.01, ge=0.0, le=1.0)
    """Non-inferiority margin, in quality units ([0, 1] metrics)."""
    level: float = Field(0.95, gt=0.5, lt=1.0)
    """One-sided confidence of every bound the choice reads (paired bootstrap over queries)."""
    budgets: Budgets = Budgets()
    price_per_1k_tokens: float | None = Field(None, gt=0.0)
    """Money per 1,000 tokens: what turns `budgets.cost_per_1k_queries` into tokens."""
    quality_floors: dict[str, Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default_factory=lambda: {"q_faithfulness": 0.75, "q_answer_relevancy": 0.75})
    """Absolute thresholds by per-query metric name; a floor binds only where that metric plays
    F or R for the dataset."""
    error_rate_slo: float = Field(0.01, ge=0.0, le=1.0)
    """Largest share of failed queries (rows with an `error` column; offline rows have none)."""
    n_resamples: int = Field(2000, ge=200, le=100_000)
    """Paired bootstrap resamples behind every bound."""

    @model_validator(mode="after")
    def _priced(self) -> Objective:
        if self.budgets.cost_per_1k_queries is not None and self.price_per_1k_tokens is None:
            raise ValueError("budgets.cost_per_1k_queries needs price_per_1k_tokens (money per "
                             "1,000 tokens) to be turned into a token budget")
        return self

    def token_budget(self) -> float | None:
        """The tighter of `budgets.tokens` and the cost budget in tokens per query (cost per
        1k queries = tokens per query × price per 1k tokens); None when neither is set."""
        b = [self.budgets.tokens]
        if self.budgets.cost_per_1k_queries is not None:
            b.append(self.budgets.cost_per_1k_queries / float(self.price_per_1k_tokens))
        b = [x for x in b if x is not None]
        return min(b) if b else None


class TunerSettings(StrictSettings):
    SECTION = "policy"

    bounds: Bounds = Bounds()
    k_grid: tuple[int, ...] | None = None
    """Values the k head chooses from (those outside `bounds.k` are dropped); None = every
    integer in `bounds.k`."""
    fusion_step: float = Field(0.05, gt=0.0, le=1.0)
    """fusion_weight actions are snapped to this grid so evaluations can be cached."""
    fusion_grid: float = Field(0.1, gt=0.0, le=1.0)
    """Spacing of fusion_weight in the exhaustive-grid baseline (`ConfigSpace.grid`)."""
    mmr_step: float = Field(0.1, gt=0.0, le=1.0)
    rerank_mix_step: float = Field(0.25, gt=0.0, le=1.0)
    abstain_step: float = Field(0.1, gt=0.0, le=1.0)
    """mmr_lambda / rerank_mix / abstain_threshold actions snap to these grids."""
    discrete: Discrete = Discrete()
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    reranker: Literal["cosine", "cross_encoder"] = "cosine"
    thresholds: Thresholds = Thresholds()
    reward_weights: RewardWeights = RewardWeights()
    cost_ref_tokens: float = Field(1000.0, gt=0.0)
    """C_ref: tokens per query (in + out) that cost one unit."""
    gate_penalty: Literal["cliff", "shaped"] = "shaped"
    """How PPO's training signal charges a failed gate: cliff = λ per failed gate (+0.5 when
    unstable), exactly the reward; shaped = λ·min(1, relative violation / 10%) per gate
    (`RewardSpec.shaped_reward`). Reports, incumbents and promotion always use the reward."""
    instability_band: float = Field(0.05, ge=0.0)
    """P += 0.5 when the standard error of the batch's mean quality exceeds this."""
    gate_z: float = Field(0.0, ge=0.0, le=5.0)
    """Margin of the faithfulness and relevancy gates, in standard errors of the batch mean: a
    gate passes when mean − gate_z·se ≥ its threshold (`RewardSpec.gates`). 0 (the default):
    the point estimate. 1.645: its one-sided 95% lower bound, so a config that clears a gate
    on the tuning split only by sampling luck is not chosen."""
    gate_expected: bool = False
    """Charge the faithfulness and relevancy gates in the reward by their probability of
    failing on a new batch of as many queries, Φ((θ − mean)/(√2·se)), instead of 0/1
    (`RewardSpec.expected_penalty`): the tuner then maximises the expected reward on new
    queries, and a search is drawn towards configs that clear the gates with room to spare.
    Exclusive with `gate_z` > 0."""
    action_mode: Literal["absolute", "delta"] = "absolute"
    episode: Episode = Episode()
    base: dict[str, Any] = Field(default_factory=lambda: {"generator": "extractive",
                                                          "n_candidates": 50})
    """RAGConfig fields every action starts from (the static default config)."""
    datasets: dict[str, DatasetSlice] = Field(default_factory=dict)
    objective: Objective = Objective()
    """What the run's operating point is chosen for (`Objective`)."""
    ppo: PPOSettings = TUNER_PPO.settings
    """PPO hyperparameters (`rl.common.ppo_settings`); unset keys take `TUNER_PPO`'s values."""
    seed: int = 0

    @field_validator("ppo", mode="before")
    @classmethod
    def _ppo_defaults(cls, v: Any) -> Any:
        return TUNER_PPO.fill(v)

    @field_serializer("ppo")
    def _ppo_keys(self, ppo: PPOSettings, info: SerializationInfo) -> dict[str, Any]:
        return TUNER_PPO.dump(ppo, info)

    @model_validator(mode="after")
    def _check(self) -> TunerSettings:
        if self.gate_expected and self.gate_z > 0:
            raise ValueError("gate_expected and gate_z > 0 are two rules for the same gates: "
                             "set one")
        if self.k_grid is None:
            return self
        ks = [k for k in self.k_grid if self.bounds.k.min <= k <= self.bounds.k.max]
        if not ks:
            raise ValueError(f"k_grid has no value inside bounds.k "
                             f"[{self.bounds.k.min}, {self.bounds.k.max}]")
        if list(self.k_grid) != sorted(set(self.k_grid)):
            raise ValueError("k_grid must be strictly increasing")
        return self

    def _after_load(self, where: str, source: YamlSource | None) -> TunerSettings:
        """The base config and every variant label must make valid RAGConfigs."""
        at = source.under if source is not None else (lambda *_: None)
        RAGConfig.from_mapping(dict(self.base), f"{where}.base", at("base"))
        for label, over in self.variants.items():
            if not isinstance(over, dict):
                raise ConfigError(f"{where}.variants.{label}", "must be a mapping")
            RAGConfig.from_mapping({**self.base, **over}, f"{where}.variants.{label}",
                                   at("variants", label))
        return self

    # ---- derived ----------------------------------------------------------------------------
    def ppo_discount(self) -> tuple[float, float]:
        """(γ, GAE λ) with the mode-dependent defaults resolved."""
        delta = self.action_mode == "delta"
        return self.ppo.discount(0.99 if delta else 0.0, 0.95 if delta else 0.0)

    @property
    def ks(self) -> tuple[int, ...]:
        """The k head's values: `k_grid` inside `bounds.k`, or every integer of the bounds."""
        lo, hi = self.bounds.k.min, self.bounds.k.max
        if self.k_grid is None:
            return tuple(range(lo, hi + 1))
        return tuple(k for k in self.k_grid if lo <= k <= hi)

    def with_legacy_space(self) -> TunerSettings:
        """This policy with every head beyond variant, k, rerank, fusion_weight and prompt pinned to the base config's value and,
        when `k_grid` is unset, the old k grid (`LEGACY_K_GRID`): the small space (504 configs
        with the default heads) that the exhaustive grid baseline and older benches enumerate.
        Configs of that space hash as they did when it was the whole space."""
        base = self.base_config()
        data = self.model_dump(mode="json", by_alias=True)
        if self.k_grid is None:
            data["k_grid"] = list(LEGACY_K_GRID)
        data["discrete"].update(normalisation=[base.normalisation],
                                rerank_depth=[base.rerank_depth],
                                query_formulation=[base.query_formulation or "last_turn"],
                                generator=None)
        mix = 1.0 if base.rerank_mix is None else base.rerank_mix
        thr = (ExtractiveReader.abstain_below if base.abstain_threshold is None
               else base.abstain_threshold)
        data["bounds"].update(mmr_lambda={"min": base.mmr_lambda, "max": base.mmr_lambda},
                              rerank_mix={"min": mix, "max": mix},
                              abstain_threshold={"min": thr, "max": thr})
        return TunerSettings.from_dict(data)

    def base_config(self) -> RAGConfig:
        return RAGConfig.from_dict(dict(self.base), where="policy.base")

    def variant_overrides(self, label: str) -> dict[str, Any]:
        """RAGConfig fields a variant label stands for."""
        if label in self.variants:
            return dict(self.variants[label])
        if label in RETRIEVERS:
            return {"variant": label}
        raise ConfigError("policy.discrete.variant",
                          f"label {label!r} is neither a retriever ({', '.join(RETRIEVERS)}) "
                          f"nor defined under policy.variants")

    def check_variants(self) -> None:
        for label in self.discrete.variant:
            self.variant_overrides(label)

    def slice_for(self, dataset: str, default: DatasetSlice | None = None) -> DatasetSlice:
        """`datasets[dataset]`, else `default` (e.g. `DatasetSlice.for_gold` of the data),
        else `DatasetSlice()`."""
        return self.datasets.get(dataset, default or DatasetSlice())

    def thresholds_for(self, dataset: str, default: DatasetSlice | None = None) -> Thresholds:
        return self.slice_for(dataset, default).thresholds or self.thresholds

    # ---- loading (`from_mapping`, `from_yaml`: rag.settings_base) ---------------------------
    @classmethod
    def from_dict(cls, data: Any) -> TunerSettings:
        """A mapping, bare or as `{policy: {...}}`; errors name `policy.<key>`."""
        data, _ = cls._section_of(data, "")
        return cls.from_mapping(data)

    @classmethod
    def defaults(cls) -> TunerSettings:
        """The documented defaults file (its values equal the model defaults plus the
        per-dataset slices)."""
        return cls.from_yaml(DEFAULTS_PATH)

    def with_overrides(self, **changes: Any) -> TunerSettings:
        data = self.model_dump(mode="json", by_alias=True)
        data.update(changes)
        return TunerSettings.from_dict(data)
