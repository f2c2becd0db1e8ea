"""The per-query policy's mixed action heads: the gymnasium Dict action space, the decoding of
an action into a `RAGConfig`, which heads act in which context, and propensities.

Heads (`HeadSettings` gives the values; keys in sorted order, as RLlib flattens them):
    variant            Discrete   retriever: bm25 / dense / hybrid / graph
    k                  Discrete   index into the coarse k set (`HeadSettings.ks`)
    rerank             Discrete   index into `rerank_depths` (0 = off, d = rerank d candidates)
    generator          Discrete   index into the `generator:prompt_id` arms
    mmr_lambda         Box(0, 1)  MMR trade-off, mapped onto `mmr_range`
    fusion_weight      Box(0, 1)  dense weight of hybrid fusion   -- gated: variant == hybrid
    normalisation      Discrete   hybrid's score normalisation    -- gated: variant == hybrid
                                  (absent when `normalisations` lists one value)
    abstain_threshold  Box(0, 1)  extractive abstention threshold -- gated: an extractive
                                  `*_abstain` generator arm
    query_formulation  Discrete   conversational data only (absent otherwise)
    defer              Discrete   (`HeadSettings.defer` only) 1 = take the base policy's config
                                  for this query (a residual policy over e.g. the supervised
                                  router), 0 = the heads above decide; every other head is
                                  gated on defer == 0
A Box head's value u in [0, 1] is what RLlib's action normalisation hands the env (a Gaussian
sample x, clipped to [-1, 1], u = (x + 1) / 2); it maps linearly onto the head's range and then
snaps to `box_step` (`BoxMap`), so equal decisions hit the evaluator's row cache.

Gates (`HeadLayout.gates`: head -> (parent head, parent values that make it act)); gates chain
(a head acts when its parent has an opening value and the parent itself acts: with `defer`, the
fusion weight acts when defer == 0 and variant == hybrid). A gated head
that does not act in a sample contributes nothing to the log-probability, entropy or KL of the
policy (`masked_sum`, `gate_weights`), so PPO never gets a gradient for a no-op choice. The
RLlib distribution that applies them lives in `rl.routing.ppo_module`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from rag.config import RAGConfig
from rag.generation.extractive import ExtractiveReader
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace
from rl.routing.settings import HeadSettings

BOX_HEADS = ("abstain_threshold", "fusion_weight", "mmr_lambda")


@dataclass(frozen=True)
class BoxMap:
    """u in [0, 1] -> lo + u (hi - lo), snapped to multiples of `step` within [lo, hi]."""

    lo: float
    hi: float
    step: float

    def values(self) -> list[float]:
        j0, j1 = math.ceil(self.lo / self.step - 1e-9), math.floor(self.hi / self.step + 1e-9)
        return [round(j * self.step, 6) for j in range(j0, j1 + 1)] or [self.lo]

    def value(self, u: float) -> float:
        x = self.lo + float(np.clip(u, 0.0, 1.0)) * (self.hi - self.lo)
        vals = self.values()
        return vals[int(np.argmin([abs(v - x) for v in vals]))]

    def bin_masses(self, mean: float, std: float) -> dict[float, float]:
        """Probability of each snapped value when RLlib samples the raw action x ~ N(mean,
        std) (u = (clip(x, -1, 1) + 1) / 2): the mass of x's interval that maps to it."""
        from math import erf

        vals = self.values()
        span = max(self.hi - self.lo, 1e-12)
        # raw-x edges halfway between neighbouring values; the outer bins run to +-inf
        mids = [((a + b) / 2 - self.lo) / span * 2 - 1 for a, b in zip(vals, vals[1:], strict=False)]

        edges = [-math.inf, *mids, math.inf]

        def cdf(x: float) -> float:
            if math.isinf(x):
                return 0.0 if x < 0 else 1.0
            return 0.5 * (1 + erf((x - mean) / (max(std, 1e-8) * math.sqrt(2))))

        return {v: cdf(edges[i + 1]) - cdf(edges[i]) for i, v in enumerate(vals)}


class HeadLayout:
    """The action space of one dataset's policy, and action -> RAGConfig."""

    def __init__(self, heads: HeadSettings, policy: TunerSettings, conversational: bool = False):
        self.settings = heads
        self.space = ConfigSpace(policy, conversational)
        self.conversational = conversational
        self.variants = tuple(heads.variants)
        self.ks = tuple(heads.ks)
        self.depths = tuple(heads.rerank_depths)
        self.arms = tuple(tuple(a.split(":", 1)) for a in heads.generator_arms)
        self.formulations = tuple(heads.query_formulations) if conversational else ()
        self.norms = tuple(heads.normalisations)
        w = self.space.w
        self.boxes = {"fusion_weight": BoxMap(w.lo, w.hi, heads.box_step),
                      "mmr_lambda": BoxMap(heads.mmr_range.min, heads.mmr_range.max,
                                           heads.box_step),
                      "abstain_threshold": BoxMap(heads.abstain_range.min,
                                                  heads.abstain_range.max, heads.box_step)}
        abstain = [i for i, (g, p) in enumerate(self.arms)
                   if g == "extractive" and p.endswith("_abstain")]
        self.gates: dict[str, tuple[str, tuple[int, ...]]] = {}
        if "hybrid" in self.variants:
            self.gates["fusion_weight"] = ("variant", (self.variants.index("hybrid"),))
            if len(self.norms) > 1:
                self.gates["normalisation"] = ("variant", (self.variants.index("hybrid"),))
        if abstain:
            self.gates["abstain_threshold"] = ("generator", tuple(abstain))
        self.discrete = {"variant": len(self.variants), "k": len(self.ks),
                         "rerank": len(self.depths), "generator": len(self.arms)}
        if self.formulations:
            self.discrete["query_formulation"] = len(self.formulations)
        if "normalisation" in self.gates:
            self.discrete["normalisation"] = len(self.norms)
        self.box_heads = tuple(h for h in BOX_HEADS if h == "mmr_lambda" or h in self.gates)
        self.defers = bool(heads.defer)
        if self.defers:
            for h in [*self.discrete, *self.box_heads]:
                self.gates.setdefault(h, ("defer", (0,)))
            self.discrete["defer"] = 2
        self.names = tuple(sorted([*self.discrete, *self.box_heads]))

    def action_space(self) -> spaces.Dict:
        heads: dict[str, spaces.Space] = {}
        for h in self.names:
            heads[h] = (spaces.Discrete(self.discrete[h]) if h in self.discrete
                        else spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32))
        return spaces.Dict(heads)

    def gates_spec(self) -> dict[str, list]:
        """The gates as JSON-able lists (what the RLModule's model config carries)."""
        return {h: [p, list(v)] for h, (p, v) in self.gates.items()}

    def active(self, action: Mapping[str, Any]) -> dict[str, bool]:
        """Which heads act in `action` (ungated heads always do; gates chain)."""
        m = active_masks({h: np.asarray(action[h]).reshape(-1)[:1] for h in self.names
                          if h in self.discrete}, self.gates)
        return {h: bool(m[h][0]) if h in m else True for h in self.names}

    def check_base(self, base: Any, n: int, name: str) -> None:
        """With a `defer` head, `base` must give the base policy's config for each of the `n`
        queries (a ValueError naming `name` otherwise); without one it is not needed."""
        if self.defers and (base is None or len(base) != n):
            got = "none" if base is None else f"{len(base)}"
            raise ValueError(f"{name}: the policy has a defer head and needs the base "
                             f"policy's config for each of the {n} queries, got {got}")

    def defers_in(self, action: Mapping[str, Any]) -> bool:
        """Whether `action` hands the query to the base policy (the `defer` head says 1)."""
        return self.defers and int(np.asarray(action["defer"]).reshape(-1)[0]) == 1

    def decode(self, action: Mapping[str, Any], base: RAGConfig | None = None) -> RAGConfig:
        """The config an action stands for (Box heads mapped and snapped; inactive heads take
        canonical values through `ConfigSpace.make`, so equal configs hash equal). With a
        `defer` head saying 1 it is `base`, the base policy's config for this query (an error
        when none is given)."""
        if self.defers_in(action):
            if base is None:
                raise ValueError("the action defers to the base policy, but no base config "
                                 "was given for this query")
            return base

        def idx(h: str) -> int:
            return int(np.asarray(action[h]).reshape(-1)[0])

        def box(h: str) -> float | None:
            if h not in action:
                return None
            return self.boxes[h].value(float(np.asarray(action[h]).reshape(-1)[0]))

        variant, k = self.variants[idx("variant")], self.ks[idx("k")]
        depth = self.depths[idx("rerank")]
        gen, prompt = self.arms[idx("generator")]
        w = box("fusion_weight")
        heads: dict[str, Any] = {"mmr_lambda": box("mmr_lambda"),
                                 "rerank_depth": depth or None,
                                 "abstain_threshold": box("abstain_threshold")}
        if self.formulations:
            heads["query_formulation"] = self.formulations[idx("query_formulation")]
        if "normalisation" in self.discrete:
            heads["normalisation"] = self.norms[idx("normalisation")]
        elif len(self.norms) == 1:
            heads["normalisation"] = self.norms[0]
        base_w = self.space.base.fusion_weight
        cfg = self.space.make(variant, k, "on" if depth else "off",
                              base_w if w is None else w, prompt, **heads)
        if cfg.generator != gen:  # an LLM arm the tuner's space does not list
            cfg = cfg.replace(generator=gen, abstain_threshold=None)
        return cfg

    def encode(self, config: RAGConfig) -> tuple[dict[str, Any], bool]:
        """The action nearest to `config` (the inverse of `decode` where one exists): each head
        takes the config's value, or the nearest one it has (k, rerank depth, box values);
        returns (action, exact) with exact = decode(action) hashes equal to `config`. Fields no
        head sets (rerank mix, a normalisation the head does not list, ...) are what make a
        config inexpressible."""
        def near(vals: tuple, x: float) -> int:
            return int(np.argmin([abs(v - x) for v in vals]))

        def u(h: str, x: float) -> np.ndarray:
            b = self.boxes[h]
            return np.array([0.0 if b.hi == b.lo else (x - b.lo) / (b.hi - b.lo)], np.float32)

        arms = [i for i, (g, p) in enumerate(self.arms) if p == config.prompt_id] or [0]
        arm = next((i for i in arms if self.arms[i][0] == config.generator), arms[0])
        on = [i for i, d in enumerate(self.depths) if d > 0]
        # a depth below k is raised to k (`ConfigSpace.make`): compare the depths as applied
        applied = tuple(min(max(self.depths[i], config.k), config.n_candidates) for i in on)
        rerank = (0 if config.rerank == "none" or not on else
                  on[near(applied, config.rerank_depth)])
        label = next((v for v in self.variants
                      if self.space._fields[v]["variant"] == config.variant), self.variants[0])
        thr = (ExtractiveReader.abstain_below if config.abstain_threshold is None
               else config.abstain_threshold)
        a: dict[str, Any] = {"variant": self.variants.index(label), "k": near(self.ks, config.k),
                             "rerank": rerank, "generator": arm,
                             "mmr_lambda": u("mmr_lambda", config.mmr_lambda),
                             "fusion_weight": u("fusion_weight", config.fusion_weight),
                             "abstain_threshold": u("abstain_threshold", thr)}
        if self.formulations:
            qf = config.query_formulation or "last_turn"
            a["query_formulation"] = (self.formulations.index(qf) if qf in self.formulations
                                      else 0)
        if "normalisation" in self.discrete:
            a["normalisation"] = (self.norms.index(config.normalisation)
                                  if config.normalisation in self.norms else 0)
        if self.defers:
            a["defer"] = 0
        a = {h: a[h] for h in self.names}
        return a, self.decode(a).config_hash == config.config_hash


class ArmLayout:
    """A single categorical head, `arm`, over a fixed list of configs (e.g. the router's
    portfolio, `rl.routing.portfolio`): action {"arm": j} decodes to `configs[j]`. The same
    interface as `HeadLayout` (no gates, no box heads, no defer), so `PerQueryPPO`, its warm
    start and its propensities work unchanged; over a cached (queries x arms) table
    (`rl.routing.worlds.TableWorld`) every sample is a lookup. `policy`: the tuner settings
    the configs were made with (saved with the policy)."""

    def __init__(self, configs: list[RAGConfig], policy: TunerSettings):
        if not configs:
            raise ValueError("ArmLayout needs at least one config")
        self.configs = list(configs)
        self.policy = policy
        self.conversational = False
        self.names = ("arm",)
        self.discrete = {"arm": len(self.configs)}
        self.box_heads: tuple[str, ...] = ()
        self.boxes: dict[str, BoxMap] = {}
        self.gates: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.defers = False
        self._index = {c.config_hash: j for j, c in enumerate(self.configs)}

    def action_space(self) -> spaces.Dict:
        return spaces.Dict({"arm": spaces.Discrete(len(self.configs))})

    def gates_spec(self) -> dict[str, list]:
        return {}

    def active(self, action: Mapping[str, Any]) -> dict[str, bool]:
        return {"arm": True}

    def check_base(self, base: Any, n: int, name: str) -> None:
        """No defer head: nothing to check."""

    def defers_in(self, action: Mapping[str, Any]) -> bool:
        return False

    def decode(self, action: Mapping[str, Any], base: RAGConfig | None = None) -> RAGConfig:
        return self.configs[int(np.asarray(action["arm"]).reshape(-1)[0])]

    def encode(self, config: RAGConfig) -> tuple[dict[str, Any], bool]:
        """({"arm": j}, True) for the arm whose config hashes equal to `config`; a config that
        is no arm is a ValueError naming its hash."""
        j = self._index.get(config.config_hash)
        if j is None:
            raise ValueError(f"config {config.config_hash} is none of the layout's "
                             f"{len(self.configs)} arms")
        return {"arm": j}, True


def _chain(gates: Mapping[str, tuple[str, Any]], own: Callable[[str, Any], Any]
           ) -> dict[str, Any]:
    """Per gated head h with gate (parent, vals): own(parent, vals) times the parent's value
    when the parent is itself gated (gates chain; a cycle is an error)."""
    out: dict[str, Any] = {}

    def of(h: str, seen: tuple[str, ...]) -> Any:
        if h in out:
            return out[h]
        if h in seen:
            raise ValueError(f"head gates form a cycle through {h!r}")
        parent, vals = gates[h]
        up = of(parent, (*seen, h)) if parent in gates else 1.0
        out[h] = own(parent, vals) * up
        return out[h]

    for h in gates:
        of(h, ())
    return out


def gate_weights(probs_of_parent: Mapping[str, Any], gates: Mapping[str, tuple[str, Any]]
                 ) -> dict[str, Any]:
    """Per gated head, the probability (per row) that it acts: the parent categorical's mass on
    the values that open the gate, times the parent's own probability of acting (chained
    gates). `probs_of_parent`: parent head -> (batch, n) probabilities (numpy or torch). Used
    to weight a gated head's entropy and KL."""
    return _chain(gates, lambda parent, vals: probs_of_parent[parent][:, list(vals)].sum(-1))


def active_masks(actions: Mapping[str, Any], gates: Mapping[str, tuple[str, Any]]
                 ) -> dict[str, Any]:
    """Per gated head, 1.0 where the sampled parent value opens the gate and the parent acts
    itself, else 0.0 (numpy or torch, following the actions' type)."""
    def own(parent: str, vals: Any) -> Any:
        a = actions[parent].reshape(-1)
        if hasattr(a, "new_tensor"):  # torch
            import torch

            return torch.isin(a.long(), a.new_tensor(list(vals)).long()).float()
        return np.isin(np.asarray(a).astype(int), list(vals)).astype(np.float64)

    return _chain(gates, own)


def masked_sum(terms: Mapping[str, Any], weights: Mapping[str, Any]) -> Any:
    """sum_h weights[h] * terms[h] over heads; heads without a weight count fully. With
    `active_masks` as weights this is a log-probability that excludes inactive heads; with
    `gate_weights` an entropy or KL that counts a gated head by how often it acts."""
    total = 0
    for h, t in terms.items():
        total = total + (t * weights[h] if h in weights else t)
    return total
