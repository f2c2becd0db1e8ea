"""The tuner's action space: gymnasium Dict actions <-> RAGConfigs.

Heads (absolute mode): variant Discrete(V), k Discrete(len(k grid)), rerank Discrete(2),
fusion_weight Box(1) in its bounds, prompt Discrete(P). In delta mode the k head is Discrete(3)
(down one grid step / stay / up one) and fusion_weight a Box in [-0.25, 0.25] added to the
current weight; variant, rerank and prompt stay absolute (they have no order to step along).

`grid()` enumerates the discretised space (fusion weights only for hybrid: other retrievers
ignore it) — the exhaustive baseline and the cache warm-up iterate over it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from rag.config import RAGConfig
from rl.tuner.settings import TunerSettings

DELTA_W = 0.25


class ConfigSpace:
    def __init__(self, policy: TunerSettings):
        policy.check_variants()
        self.policy = policy
        self.variants = policy.discrete.variant
        self.ks = policy.ks
        self.reranks = policy.discrete.rerank
        self.prompts = policy.discrete.prompt_id
        self.w_lo = policy.bounds.fusion_weight.min
        self.w_hi = policy.bounds.fusion_weight.max
        self.base = policy.base_config()
        self.delta = policy.action_mode == "delta"

    # ---- gymnasium ------------------------------------------------------------------------
    def action_space(self) -> spaces.Dict:
        if self.delta:
            k_head: spaces.Space = spaces.Discrete(3)
            w_head = spaces.Box(-DELTA_W, DELTA_W, shape=(1,), dtype=np.float32)
        else:
            k_head = spaces.Discrete(len(self.ks))
            w_head = spaces.Box(self.w_lo, self.w_hi, shape=(1,), dtype=np.float32)
        return spaces.Dict({"variant": spaces.Discrete(len(self.variants)), "k": k_head,
                            "rerank": spaces.Discrete(len(self.reranks)),
                            "fusion_weight": w_head,
                            "prompt": spaces.Discrete(len(self.prompts))})

    # ---- decoding -------------------------------------------------------------------------
    def snap_w(self, w: float) -> float:
        step = self.policy.fusion_step
        w = float(np.clip(w, self.w_lo, self.w_hi))
        return float(np.clip(round(round(w / step) * step, 6), self.w_lo, self.w_hi))

    def to_config(self, action: Mapping[str, Any], current: RAGConfig | None = None
                  ) -> RAGConfig:
        """The config an action stands for (delta actions move from `current`)."""
        v = self.variants[int(action["variant"])]
        rr = self.reranks[int(action["rerank"])]
        prompt = self.prompts[int(action["prompt"])]
        w_raw = float(np.asarray(action["fusion_weight"]).reshape(-1)[0])
        if self.delta:
            cur = current or self.base
            ki = int(np.argmin([abs(k - cur.k) for k in self.ks]))
            ki = int(np.clip(ki + int(action["k"]) - 1, 0, len(self.ks) - 1))
            w = self.snap_w(cur.fusion_weight + w_raw)
        else:
            ki = int(action["k"])
            w = self.snap_w(w_raw)
        return self.make(v, self.ks[ki], rr, w, prompt)

    def make(self, variant_label: str, k: int, rerank: str, w: float, prompt: str) -> RAGConfig:
        over = self.policy.variant_overrides(variant_label)
        fields: dict[str, Any] = {**self.base.model_dump(), **over, "k": k,
                                  "rerank": self.policy.reranker if rerank == "on" else "none",
                                  "prompt_id": prompt}
        if fields["variant"] == "hybrid":
            fields["fusion_weight"] = self.snap_w(w)
        else:  # the weight does not act: keep the base one so equal configs hash equal
            fields["fusion_weight"] = self.base.fusion_weight
        fields["n_candidates"] = max(fields.get("n_candidates", 50), k)
        fields["rerank_depth"] = max(fields.get("rerank_depth", 30), k)
        return RAGConfig.from_dict(fields, where="policy.action")

    def to_action(self, config: RAGConfig, label: str | None = None) -> dict[str, Any]:
        """The absolute action for a config (nearest grid k)."""
        label = label or config.variant
        return {"variant": self.variants.index(label),
                "k": int(np.argmin([abs(k - config.k) for k in self.ks])),
                "rerank": self.reranks.index("off" if config.rerank == "none" else "on"),
                "fusion_weight": np.array([config.fusion_weight], dtype=np.float32),
                "prompt": self.prompts.index(config.prompt_id)}

    # ---- enumeration ----------------------------------------------------------------------
    def weights_grid(self) -> list[float]:
        step = self.policy.fusion_grid
        n = int(round((self.w_hi - self.w_lo) / step))
        return sorted({self.snap_w(self.w_lo + i * step) for i in range(n + 1)})

    def grid(self) -> Iterator[RAGConfig]:
        """Every distinct config of the discretised space."""
        seen: set[str] = set()
        for v, k, rr, p in itertools.product(self.variants, self.ks, self.reranks, self.prompts):
            is_hybrid = {**self.base.model_dump(),
                         **self.policy.variant_overrides(v)}["variant"] == "hybrid"
            for w in (self.weights_grid() if is_hybrid else [self.base.fusion_weight]):
                c = self.make(v, k, rr, w, p)
                if c.config_hash not in seen:
                    seen.add(c.config_hash)
                    yield c

    def one_hot(self, config: RAGConfig) -> np.ndarray:
        """The config as features: one-hot variant/rerank/prompt, scaled k index and weight."""
        a = self.to_action(config, self._label(config))
        out = np.zeros(len(self.variants) + len(self.reranks) + len(self.prompts) + 2,
                       dtype=np.float32)
        out[a["variant"]] = 1
        out[len(self.variants) + a["rerank"]] = 1
        out[len(self.variants) + len(self.reranks) + a["prompt"]] = 1
        out[-2] = a["k"] / max(len(self.ks) - 1, 1)
        out[-1] = (config.fusion_weight - self.w_lo) / max(self.w_hi - self.w_lo, 1e-9)
        return out

    def _label(self, config: RAGConfig) -> str:
        for label in self.variants:
            over = self.policy.variant_overrides(label)
            if all(getattr(config, f) == val for f, val in over.items()):
                return label
        return self.variants[0]

    # ---- Ray Tune (issue 18 item 4; minimal stand-in: helper d1's space.py replaces these) --
    def tune_param_space(self) -> dict[str, Any]:
        """The space as Ray Tune domains, one per head: variant, k, rerank, prompt
        (`tune.choice`) and fusion_weight (`tune.uniform` in its bounds)."""
        from ray import tune

        return {"variant": tune.choice(list(self.variants)), "k": tune.choice(list(self.ks)),
                "rerank": tune.choice(list(self.reranks)),
                "fusion_weight": tune.uniform(self.w_lo, self.w_hi),
                "prompt": tune.choice(list(self.prompts))}

    def from_params(self, params: Mapping[str, Any]) -> RAGConfig:
        """The config of one point of `tune_param_space` (the weight snapped to its step)."""
        return self.make(params["variant"], int(params["k"]), params["rerank"],
                         float(params["fusion_weight"]), params["prompt"])
