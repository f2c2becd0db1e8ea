"""The tuner's config space: its heads, their canonical configs, and how searchers address it.

Heads (`rl.kernel.settings` documents each): variant, k, rerank, fusion_weight, prompt, and the
further heads — normalisation, mmr_lambda, rerank_depth, rerank_mix, abstain_threshold,
query_formulation, generator, context_budget. `make` turns one value per head into a RAGConfig and
canonicalises the heads that do not act in it (the fusion weight and normalisation outside
hybrid, rerank depth and mix with rerank off, the abstain threshold without an `*_abstain`
prompt and the extractive generator, the query formulation on single-turn data), so equal
configs hash equal; Box heads snap to their step, so evaluations cache.

Searchers address the space as
    size()                  the exact number of distinct configs (combinatorial, no enumeration)
    sample(rng)             a config with every head drawn uniformly
    tune_param_space()      Ray Tune domains, one per head with > 1 value; `from_params` inverts
    suggest(optuna_trial)   Optuna define-by-run (conditional heads only where they act)
    grid()                  every distinct config, for small (pinned) spaces only
and RLlib through the gymnasium action space in `rl.kernel.actions` (`action_space`,
`to_config`, `to_action`, `one_hot`, mixed in here).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag.config import RAGConfig
from rag.errors import ConfigError
from rag.generation.extractive import ExtractiveReader
from rl.kernel.actions import DELTA_W, ActionCodec
from rl.kernel.settings import TunerSettings

__all__ = ["DELTA_W", "ConfigSpace", "BoxHead", "is_conversational"]

GRID_LIMIT = 20_000
"""`grid()` refuses spaces with more configs than this."""
HEADS = ("variant", "k", "rerank", "fusion_weight", "prompt")
"""The heads every space has (also the RLlib action keys that are always present)."""
EXTRA_HEADS = ("normalisation", "mmr_lambda", "rerank_depth", "rerank_mix",
               "abstain_threshold", "query_formulation", "generator", "context_budget")
"""Heads that are part of a space only where they have > 1 value and can act."""
# fields a head sets: variant labels that differ only in these give the same configs
_HEAD_FIELDS = {"k", "rerank", "prompt_id", "fusion_weight", "normalisation", "mmr_lambda",
                "rerank_mix", "abstain_threshold", "query_formulation", "context_budget"}


@dataclass(frozen=True)
class BoxHead:
    """A continuous head in [lo, hi], snapped to multiples of `step` (clipped to the bounds)."""

    lo: float
    hi: float
    step: float

    @property
    def pinned(self) -> bool:
        return self.lo == self.hi

    def snap(self, x: float) -> float:
        x = float(np.clip(float(x), self.lo, self.hi))
        return float(np.clip(round(round(x / self.step) * self.step, 6), self.lo, self.hi))

    def values(self) -> list[float]:
        """Every value `snap` can return."""
        j0, j1 = math.floor(self.lo / self.step), math.ceil(self.hi / self.step)
        return sorted({self.snap(round(j * self.step, 6)) for j in range(j0, j1 + 1)})


def is_conversational(examples) -> bool:
    """Whether any example carries an earlier turn (`Example.history`): the query formulation
    head acts only then."""
    return any(e.history for e in examples)


class ConfigSpace(ActionCodec):
    def __init__(self, policy: TunerSettings, conversational: bool = False):
        policy.check_variants()
        b, d = policy.bounds, policy.discrete
        self.policy = policy
        self.conversational = conversational
        self.variants = d.variant
        self.ks = policy.ks
        self.reranks = d.rerank
        self.prompts = d.prompt_id
        self.w = BoxHead(b.fusion_weight.min, b.fusion_weight.max, policy.fusion_step)
        self.w_lo, self.w_hi = self.w.lo, self.w.hi
        self.norms = d.normalisation
        self.mmr = BoxHead(b.mmr_lambda.min, b.mmr_lambda.max, policy.mmr_step)
        self.depths = d.rerank_depth
        self.mix = BoxHead(b.rerank_mix.min, b.rerank_mix.max, policy.rerank_mix_step)
        self.abstain = BoxHead(b.abstain_threshold.min, b.abstain_threshold.max,
                               policy.abstain_step)
        self.formulations = d.query_formulation if conversational else ()
        self.generators = d.generator or ()
        self.budgets = d.context_budget
        self.base = policy.base_config()
        self.delta = policy.action_mode == "delta"
        self._fields = {v: {**self.base.model_dump(), **policy.variant_overrides(v)}
                        for v in self.variants}
        self.extra_heads = tuple(h for h in EXTRA_HEADS if self._acts(h))

    # ---- heads --------------------------------------------------------------------------
    def _hybrid(self, label: str) -> bool:
        return self._fields[label]["variant"] == "hybrid"

    def _gens(self, label: str) -> tuple[str, ...]:
        return self.generators or (self._fields[label]["generator"],)

    def _acts(self, head: str) -> bool:
        """Whether `head` has > 1 value and acts in some config of the space."""
        on = "on" in self.reranks
        if head == "normalisation":
            return len(self.norms) > 1 and any(map(self._hybrid, self.variants))
        if head == "mmr_lambda":
            return not self.mmr.pinned
        if head == "rerank_depth":
            return on and len(self.depths) > 1
        if head == "rerank_mix":
            return on and not self.mix.pinned
        if head == "abstain_threshold":
            return (not self.abstain.pinned and any(p.endswith("_abstain") for p in self.prompts)
                    and any("extractive" in self._gens(v) for v in self.variants))
        if head == "query_formulation":
            return len(self.formulations) > 1
        if head == "context_budget":
            return len(self.budgets) > 1
        return len(self.generators) > 1

    def choices(self, head: str) -> tuple:
        """The values of a Discrete head."""
        return {"variant": self.variants, "k": self.ks, "rerank": self.reranks,
                "prompt": self.prompts, "normalisation": self.norms,
                "rerank_depth": self.depths, "query_formulation": self.formulations,
                "generator": self.generators, "context_budget": self.budgets}[head]

    def box(self, head: str) -> BoxHead:
        return {"fusion_weight": self.w, "mmr_lambda": self.mmr, "rerank_mix": self.mix,
                "abstain_threshold": self.abstain}[head]

    def default(self, head: str, label: str | None = None) -> Any:
        """A head's value where a caller gives none: the base config's, else the first."""
        b = self.base
        if head in ("mmr_lambda", "rerank_mix", "abstain_threshold", "fusion_weight"):
            raw = {"mmr_lambda": b.mmr_lambda, "fusion_weight": b.fusion_weight,
                   "rerank_mix": 1.0 if b.rerank_mix is None else b.rerank_mix,
                   "abstain_threshold": (ExtractiveReader.abstain_below
                                         if b.abstain_threshold is None
                                         else b.abstain_threshold)}[head]
            return self.box(head).snap(raw)
        if head == "generator":
            gens = self._gens(label or self.variants[0])
            return b.generator if b.generator in gens else gens[0]
        vals = self.choices(head)
        want = {"normalisation": b.normalisation, "rerank_depth": b.rerank_depth,
                "query_formulation": b.query_formulation or "last_turn",
                "context_budget": b.context_budget}.get(head)
        if head == "rerank_depth" and want not in vals:
            return min(vals, key=lambda d: abs(d - want))
        return want if want in vals else (vals[0] if vals else None)

    # ---- configs ------------------------------------------------------------------------
    def snap_w(self, w: float) -> float:
        return self.w.snap(w)

    def make(self, variant_label: str, k: int, rerank: str, w: float, prompt: str,
             **heads: Any) -> RAGConfig:
        """The canonical config for one value per head; `heads` holds the extra heads by name
        (`EXTRA_HEADS`; a missing one takes `default`). Box values are snapped."""
        unknown = set(heads) - set(EXTRA_HEADS)
        if unknown:
            raise ConfigError("policy.action", f"unknown heads {sorted(unknown)}")
        h = {n: heads[n] if heads.get(n) is not None else self.default(n, variant_label)
             for n in EXTRA_HEADS}
        f: dict[str, Any] = {**self._fields[variant_label], "k": k, "prompt_id": prompt,
                             "rerank": self.policy.reranker if rerank == "on" else "none"}
        if self.generators:
            f["generator"] = h["generator"]
        hybrid = f["variant"] == "hybrid"
        # heads that do not act keep the base value, so equal configs hash equal
        f["fusion_weight"] = self.w.snap(w) if hybrid else self.base.fusion_weight
        f["normalisation"] = h["normalisation"] if hybrid else self.base.normalisation
        f["mmr_lambda"] = self.mmr.snap(h["mmr_lambda"])
        f["n_candidates"] = max(f.get("n_candidates", 50), k)
        if rerank == "on":
            f["rerank_depth"] = min(max(int(h["rerank_depth"]), k), f["n_candidates"])
            mix = self.mix.snap(h["rerank_mix"])
            f["rerank_mix"] = None if mix >= 1.0 else mix  # 1.0 = the reranker's own order
        else:
            f["rerank_depth"] = max(f.get("rerank_depth", 30), k)
            f["rerank_mix"] = None
        f["abstain_threshold"] = None
        if prompt.endswith("_abstain") and f["generator"] == "extractive":
            thr = self.abstain.snap(h["abstain_threshold"])
            f["abstain_threshold"] = None if math.isclose(
                thr, ExtractiveReader.abstain_below) else thr
        qf = h["query_formulation"] if self.conversational else None
        f["query_formulation"] = None if qf in (None, "last_turn") else qf
        f["context_budget"] = h["context_budget"]
        return RAGConfig.from_dict(f, where="policy.action")

    # ---- counting and enumeration -------------------------------------------------------
    def _labels(self) -> list[str]:
        """Variant labels, one per distinct effect (labels that differ only in fields the
        heads set give the same configs)."""
        seen, out = set(), []
        for v in self.variants:
            f = {k: x for k, x in self._fields[v].items() if k not in _HEAD_FIELDS}
            if self.generators:
                f.pop("generator")
            key = json.dumps(f, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                out.append(v)
        return out

    def _depths_for(self, label: str, k: int) -> list[int]:
        n_cand = max(self._fields[label].get("n_candidates", 50), k)
        return sorted({min(max(d, k), n_cand) for d in self.depths})

    def _count(self, w_values: int) -> int:
        total = 0
        n_mix = len(self.mix.values())
        for v in self._labels():
            hyb = self._hybrid(v)
            n = (w_values * len(self.norms) if hyb else 1) * len(self.mmr.values())
            n *= sum(len(self.abstain.values()) if p.endswith("_abstain") and g == "extractive"
                     else 1 for g in self._gens(v) for p in self.prompts)
            n *= max(len(self.formulations), 1) * len(self.budgets)
            n *= sum(1 if r == "off" else len(self._depths_for(v, k)) * n_mix
                     for k in self.ks for r in self.reranks)
            total += n
        return total

    def size(self) -> int:
        """The exact number of distinct configs the space can produce (Box heads at their
        snap steps), computed from the heads' value counts, not by enumeration."""
        return self._count(len(self.w.values()))

    def weights_grid(self) -> list[float]:
        """Fusion weights of `grid()`: from the lower bound every `fusion_grid`, snapped."""
        step = self.policy.fusion_grid
        n = int(round((self.w.hi - self.w.lo) / step))
        return sorted({self.w.snap(self.w.lo + i * step) for i in range(n + 1)})

    def grid(self) -> Iterator[RAGConfig]:
        """Every distinct config, the fusion weight spaced by `fusion_grid` (so `size()` ==
        the number yielded when `fusion_grid == fusion_step`). ConfigError when that is more
        than `GRID_LIMIT` configs: pin heads (e.g. `TunerSettings.with_legacy_space`), or
        sample the space."""
        n = self._count(len(self.weights_grid()))
        if n > GRID_LIMIT:
            raise ConfigError("policy", f"the config space holds {self.size():,} configs "
                                        f"({n:,} on the grid); grid() enumerates at most "
                                        f"{GRID_LIMIT:,}: pin heads (one value, or min == max) "
                                        f"or search by sampling")
        seen: set[str] = set()
        for v in self._labels():
            hyb = self._hybrid(v)
            for k, rr, p, g in itertools.product(self.ks, self.reranks, self.prompts,
                                                 self._gens(v)):
                abst = p.endswith("_abstain") and g == "extractive"
                for w, nm, m, d, mx, a, q, cb in itertools.product(
                        self.weights_grid() if hyb else [self.base.fusion_weight],
                        self.norms if hyb else [None], self.mmr.values(),
                        self._depths_for(v, k) if rr == "on" else [None],
                        self.mix.values() if rr == "on" else [None],
                        self.abstain.values() if abst else [None],
                        self.formulations or [None], self.budgets):
                    c = self.make(v, k, rr, w, p, normalisation=nm, mmr_lambda=m,
                                  rerank_depth=d, rerank_mix=mx, abstain_threshold=a,
                                  query_formulation=q, generator=g if self.generators else None,
                                  context_budget=cb)
                    if c.config_hash not in seen:
                        seen.add(c.config_hash)
                        yield c

    # ---- searchers ----------------------------------------------------------------------
    def sample(self, rng: np.random.Generator) -> RAGConfig:
        """A config with each head drawn uniformly (Box heads in their bounds, then snapped);
        heads with one value draw nothing, so a pinned space repeats its old sequences."""
        def pick(vals):
            return vals[int(rng.integers(len(vals)))] if len(vals) > 1 else vals[0]

        def draw(box: BoxHead) -> float:
            return float(rng.uniform(box.lo, box.hi)) if not box.pinned else box.lo

        label, k, rr = pick(self.variants), pick(self.ks), pick(self.reranks)
        w, p = draw(self.w), pick(self.prompts)
        heads = {h: (draw(self.box(h)) if h in ("mmr_lambda", "rerank_mix", "abstain_threshold")
                     else pick(self.choices(h))) for h in self.extra_heads}
        return self.make(label, int(k), rr, w, p, **heads)

    def _active(self) -> list[str]:
        """Heads with more than one value, in `HEADS + EXTRA_HEADS` order."""
        core = [h for h in ("variant", "k", "rerank", "prompt") if len(self.choices(h)) > 1]
        if not self.w.pinned and any(map(self._hybrid, self.variants)):
            core.append("fusion_weight")
        return [h for h in HEADS + EXTRA_HEADS if h in core or h in self.extra_heads]

    def tune_param_space(self) -> dict[str, Any]:
        """Ray Tune domains, one per head with > 1 value: `tune.choice` for Discrete heads (k:
        `tune.randint` when its values are contiguous), `tune.quniform(lo, hi, step)` for Box
        heads. A point of it maps to a config with `from_params`."""
        from ray import tune

        out: dict[str, Any] = {}
        for h in self._active():
            if h in ("fusion_weight", "mmr_lambda", "rerank_mix", "abstain_threshold"):
                b = self.box(h)
                out[h] = tune.quniform(b.lo, b.hi, b.step)
            elif h == "k" and list(self.ks) == list(range(self.ks[0], self.ks[-1] + 1)):
                out[h] = tune.randint(self.ks[0], self.ks[-1] + 1)
            else:
                out[h] = tune.choice(list(self.choices(h)))
        return out

    def from_params(self, params: Mapping[str, Any]) -> RAGConfig:
        """The config of a search point: head name -> value (`tune_param_space` keys; a
        missing head takes `default`). ConfigError on an unknown key or a value a Discrete
        head does not offer."""
        unknown = sorted(set(params) - set(HEADS + EXTRA_HEADS))
        if unknown:
            raise ConfigError(f"params.{unknown[0]}", f"unknown head (heads: "
                                                      f"{', '.join(HEADS + EXTRA_HEADS)})")
        vals: dict[str, Any] = {}
        for h, x in params.items():
            if h in ("fusion_weight", "mmr_lambda", "rerank_mix", "abstain_threshold"):
                vals[h] = float(x)
                continue
            x = int(x) if h in ("k", "rerank_depth") else x
            if x not in self.choices(h):
                if h == "generator" and not self.generators and x == self.default(h):
                    continue
                raise ConfigError(f"params.{h}", f"{x!r} is not one of "
                                                 f"{list(self.choices(h))}")
            vals[h] = x
        label = vals.pop("variant", self.variants[0])
        core = [vals.pop("k", self.default_k()), vals.pop("rerank", self.reranks[0]),
                vals.pop("fusion_weight", self.base.fusion_weight),
                vals.pop("prompt", self.default_prompt())]
        return self.make(label, *core, **vals)

    def default_k(self) -> int:
        return min(self.ks, key=lambda k: abs(k - self.base.k))

    def default_prompt(self) -> str:
        return self.base.prompt_id if self.base.prompt_id in self.prompts else self.prompts[0]

    def to_params(self, config: RAGConfig, complete: bool = False) -> dict[str, Any]:
        """`config` as a search point over the heads with > 1 value: only the heads that act
        in it (what `suggest` asks), or every such head with `complete` (inactive ones at
        their default; a flat `tune_param_space` point). ConfigError when the space cannot
        express `config` exactly (`from_params` of the point would give another config)."""
        a = self.to_action(config)
        p: dict[str, Any] = {}
        for h in self._active():
            if h in ("fusion_weight", "mmr_lambda", "rerank_mix", "abstain_threshold"):
                p[h] = self.box(h).snap(float(np.asarray(a[h]).reshape(-1)[0]))
            else:
                p[h] = self.choices(h)[int(a[h])]
        if not complete:
            act = self._acting(config)
            p = {h: x for h, x in p.items() if h in act}
        if self.from_params(p) != config:
            raise ConfigError("config", f"{config.config_hash} is not a config of this space "
                                        f"(nearest: {self.from_params(p).config_hash})")
        return p

    def _acting(self, config: RAGConfig) -> set[str]:
        out = {"variant", "k", "rerank", "prompt", "mmr_lambda", "generator", "context_budget"}
        if config.variant == "hybrid":
            out |= {"fusion_weight", "normalisation"}
        if config.rerank != "none":
            out |= {"rerank_depth", "rerank_mix"}
        if config.prompt_id.endswith("_abstain") and config.generator == "extractive":
            out.add("abstain_threshold")
        if self.conversational:
            out.add("query_formulation")
        return out

    def suggest(self, trial: Any) -> RAGConfig:
        """Optuna define-by-run: asks `trial` for each head with > 1 value, conditional heads
        only where they act (fusion weight and normalisation for hybrid, depth and mix with
        rerank on, the abstain threshold with an `*_abstain` prompt and the extractive
        generator), and returns the config."""
        act, p = set(self._active()), {}

        def cat(h: str) -> None:
            if h in act:
                p[h] = trial.suggest_categorical(h, list(self.choices(h)))

        def num(h: str) -> None:
            if h in act:
                b = self.box(h)
                p[h] = trial.suggest_float(h, b.lo, b.hi, step=b.step)

        cat("variant")
        label = p.get("variant", self.variants[0])
        if "k" in act:
            contiguous = list(self.ks) == list(range(self.ks[0], self.ks[-1] + 1))
            p["k"] = (trial.suggest_int("k", self.ks[0], self.ks[-1]) if contiguous
                      else trial.suggest_categorical("k", list(self.ks)))
        cat("rerank")
        if self._hybrid(label):
            num("fusion_weight")
            cat("normalisation")
        num("mmr_lambda")
        if p.get("rerank", self.reranks[0]) == "on":
            cat("rerank_depth")
            num("rerank_mix")
        cat("prompt")
        cat("generator")
        gen = p.get("generator", self.default("generator", label))
        if p.get("prompt", self.default_prompt()).endswith("_abstain") and gen == "extractive":
            num("abstain_threshold")
        cat("query_formulation")
        cat("context_budget")
        return self.from_params(p)
