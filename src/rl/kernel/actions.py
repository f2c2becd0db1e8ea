"""The config space as a gymnasium Dict action space (RLlib's PPO acts in it).

Heads, absolute mode: variant Discrete(V), k Discrete(len(ks)), rerank Discrete(2),
fusion_weight Box(1) in its bounds, prompt Discrete(P) — always present — and, only where the
space has them (`ConfigSpace.extra_heads`: more than one value and able to act), normalisation
/ rerank_depth / query_formulation / generator as Discrete and mmr_lambda / rerank_mix /
abstain_threshold as Box(1) in their bounds. In delta mode the k head is Discrete(3) (down one
step of `ks` / stay / up one) and fusion_weight a Box in [-DELTA_W, DELTA_W] added to the
current weight; every other head stays absolute (no order to step along, or a range short
enough to pick from directly).

`ActionCodec` is mixed into `rl.kernel.space.ConfigSpace`, which supplies the heads' values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from rag.config import RAGConfig

DELTA_W = 0.25
BOX_HEADS = ("fusion_weight", "mmr_lambda", "rerank_mix", "abstain_threshold")


def _scalar(x: Any) -> float:
    return float(np.asarray(x).reshape(-1)[0])


class ActionCodec:
    """Actions <-> configs for a `ConfigSpace` (see the module doc)."""

    def action_space(self) -> spaces.Dict:
        if self.delta:
            k_head: spaces.Space = spaces.Discrete(3)
            w_head = spaces.Box(-DELTA_W, DELTA_W, shape=(1,), dtype=np.float32)
        else:
            k_head = spaces.Discrete(len(self.ks))
            w_head = spaces.Box(self.w.lo, self.w.hi, shape=(1,), dtype=np.float32)
        heads: dict[str, spaces.Space] = {
            "variant": spaces.Discrete(len(self.variants)), "k": k_head,
            "rerank": spaces.Discrete(len(self.reranks)), "fusion_weight": w_head,
            "prompt": spaces.Discrete(len(self.prompts))}
        for h in self.extra_heads:
            if h in BOX_HEADS:
                b = self.box(h)
                heads[h] = spaces.Box(b.lo, b.hi, shape=(1,), dtype=np.float32)
            else:
                heads[h] = spaces.Discrete(len(self.choices(h)))
        return spaces.Dict(heads)

    def to_config(self, action: Mapping[str, Any], current: RAGConfig | None = None
                  ) -> RAGConfig:
        """The config an action stands for (delta actions move from `current`). An extra head
        the action leaves out takes its default (`ConfigSpace.default`)."""
        v = self.variants[int(action["variant"])]
        rr = self.reranks[int(action["rerank"])]
        prompt = self.prompts[int(action["prompt"])]
        w_raw = _scalar(action["fusion_weight"])
        if self.delta:
            cur = current or self.base
            ki = int(np.argmin([abs(k - cur.k) for k in self.ks]))
            ki = int(np.clip(ki + int(action["k"]) - 1, 0, len(self.ks) - 1))
            w = self.w.snap(cur.fusion_weight + w_raw)
        else:
            ki = int(action["k"])
            w = self.w.snap(w_raw)
        heads: dict[str, Any] = {}
        for h in self.extra_heads:
            if h not in action:
                continue
            heads[h] = (_scalar(action[h]) if h in BOX_HEADS
                        else self.choices(h)[int(action[h])])
        return self.make(v, self.ks[ki], rr, w, prompt, **heads)

    def to_action(self, config: RAGConfig, label: str | None = None) -> dict[str, Any]:
        """The absolute action for a config (nearest k and rerank depth; a canonical None
        as the value it stands for: rerank_mix 1.0, the default abstain threshold, last_turn)."""
        label = label or self._label(config)
        a: dict[str, Any] = {
            "variant": self.variants.index(label),
            "k": int(np.argmin([abs(k - config.k) for k in self.ks])),
            "rerank": self.reranks.index("off" if config.rerank == "none" else "on"),
            "fusion_weight": np.array([config.fusion_weight], dtype=np.float32),
            "prompt": self.prompts.index(config.prompt_id)}
        for h in self.extra_heads:
            if h in BOX_HEADS:
                x = getattr(config, h)
                a[h] = np.array([self.default(h) if x is None else x], dtype=np.float32)
            elif h == "rerank_depth":  # a choice `make` turns into this depth, else the nearest
                same = [i for i, d in enumerate(self.depths) if min(max(d, config.k),
                        config.n_candidates) == config.rerank_depth]
                a[h] = same[0] if same else int(np.argmin([abs(d - config.rerank_depth)
                                                           for d in self.depths]))
            else:
                x = getattr(config, h) or self.default(h, label)
                vals = self.choices(h)
                a[h] = vals.index(x) if x in vals else vals.index(self.default(h, label))
        return a

    def one_hot(self, config: RAGConfig) -> np.ndarray:
        """The config as features: one-hot variant / rerank / prompt, scaled k index and
        fusion weight, then per extra head a one-hot (Discrete) or its value scaled to [0, 1]
        within its bounds (Box)."""
        a = self.to_action(config, self._label(config))
        parts = [np.eye(len(self.variants))[a["variant"]], np.eye(len(self.reranks))[a["rerank"]],
                 np.eye(len(self.prompts))[a["prompt"]],
                 [a["k"] / max(len(self.ks) - 1, 1),
                  (config.fusion_weight - self.w.lo) / max(self.w.hi - self.w.lo, 1e-9)]]
        for h in self.extra_heads:
            if h in BOX_HEADS:
                b = self.box(h)
                parts.append([(_scalar(a[h]) - b.lo) / max(b.hi - b.lo, 1e-9)])
            else:
                parts.append(np.eye(len(self.choices(h)))[a[h]])
        return np.concatenate(parts).astype(np.float32)

    def _label(self, config: RAGConfig) -> str:
        for label in self.variants:
            over = self.policy.variant_overrides(label)
            if all(getattr(config, f) == val for f, val in over.items()):
                return label
        return self.variants[0]
