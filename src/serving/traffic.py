"""Which pipeline answers a request: stable/canary split, shadow mirroring, or a bandit.

Pure Python (no Ray), so it is unit-tested directly; the Serve ingress holds one
`TrafficSplitter` (the split between served variants; the per-query router that picks a config
per question is `serving.policy_router`).

Split mode: a request goes to the canary when `bucket(key) < canary_percent`, where
`bucket` maps sha256(salt, key) uniformly onto [0, 100) and the key is the user id (then the
session id, then the interaction id), so a user stays on one variant while the split is
unchanged. The logged propensity is the probability of the chosen side under the split
(canary_percent / 100 or 1 − that): what off-policy estimators divide by.

Shadow: independently of the split, `bucket(interaction id, other salt) < shadow_percent`
mirrors the request to the shadow candidate; its answer is logged (and scored when gold is
known) but never returned.

Bandit mode: arms are config hashes; one UCB1 or Thompson learner (`rl.routing.arm_bandit`) per
request category; `/feedback` rewards update the arm of the interaction's category. The splitter computes
the arm probabilities first and samples from them, so the logged propensity is exactly the
probability the arm was chosen with (Thompson's is a vectorised Monte-Carlo estimate).
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rag.errors import ConfigError
from rl.routing.arm_bandit import UCB1, Bandit, Thompson
from serving.schemas import BanditSettings, TrafficSettings

OTHER_CATEGORY = "other"
THOMPSON_DRAWS = 1000


def bucket(key: str, salt: str) -> float:
    """Uniform position of `key` in [0, 100) (percent), stable across processes and runs."""
    h = hashlib.sha256(f"{salt}\x00{key}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 * 100.0


@dataclass(frozen=True)
class Decision:
    """Where one request goes. `propensity` is P(variant | request) under the current policy."""

    variant: str
    route: str
    """stable | canary | bandit."""
    propensity: float
    shadow: str | None = None
    """Variant the request is mirrored to (answer discarded), or None."""
    sticky_key: str = ""
    """Which key decided the split: user, session or request."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def arm_probabilities(bandit: Bandit, rng: np.random.Generator,
                      draws: int = THOMPSON_DRAWS) -> dict[str, float]:
    """P(select arm) under the bandit's state: exact for UCB1 (uniform over unpulled arms, else
    over the tied maximisers), a `draws`-sample Monte-Carlo estimate for Thompson."""
    arms = bandit.arms
    if isinstance(bandit, Thompson):
        post = np.array([bandit.posterior(a) for a in arms])
        sample = rng.normal(post[:, 0], post[:, 1], size=(draws, len(arms)))
        counts = np.bincount(sample.argmax(axis=1), minlength=len(arms)).astype(float)
        counts += 1e-3  # no arm has zero propensity (IPS weights stay finite)
        p = counts / counts.sum()
        return dict(zip(arms, p.tolist(), strict=True))
    if isinstance(bandit, UCB1):
        unpulled = [a for a in arms if bandit.stats[a].pulls == 0]
        if unpulled:
            chosen = unpulled
        else:
            total = sum(bandit.stats[a].pulls for a in arms)
            scores = {a: bandit.stats[a].mean + bandit.c * math.sqrt(
                math.log(total) / bandit.stats[a].pulls) for a in arms}
            best = max(scores.values())
            chosen = [a for a in arms if scores[a] >= best - 1e-12]
        return {a: (1.0 / len(chosen) if a in chosen else 0.0) for a in arms}
    return bandit.probabilities(rng)


class TrafficSplitter:
    """Thread-safe routing state: the traffic split, the variants, the per-category bandits."""

    def __init__(self, stable: str, traffic: TrafficSettings | None = None,
                 bandit: BanditSettings | None = None, canary: str | None = None,
                 shadow: str | None = None, arms: Sequence[str] = ()):
        self.traffic = traffic or TrafficSettings()
        self.bandit_settings = bandit or BanditSettings()
        self.stable, self.canary, self.shadow = stable, canary, shadow
        self.arms = list(dict.fromkeys(arms or [v for v in (stable, canary, shadow) if v]))
        self._bandits: dict[str, Bandit] = {}
        self._rng = np.random.default_rng(self.bandit_settings.seed)
        self._lock = threading.Lock()

    # ---- configuration ----------------------------------------------------------------------
    def set_traffic(self, mode: str | None = None, canary_percent: float | None = None,
                    shadow_percent: float | None = None, canary: str | None | bool = False,
                    shadow: str | None | bool = False,
                    stable: str | bool = False) -> dict[str, object]:
        """Change the split at run time. For `canary`/`shadow`, False keeps the current value
        and None removes it; `stable`: False keeps it, a variant id replaces it (it cannot be
        removed). Returns the new state."""
        if stable is not False and (not isinstance(stable, str) or not stable):
            raise ConfigError("stable", f"must be a variant id, got {stable!r}")
        with self._lock:
            changes: dict[str, object] = {}
            if mode is not None:
                changes["mode"] = mode
            if canary_percent is not None:
                changes["canary_percent"] = float(canary_percent) + 0.0  # -0.0 -> 0.0
            if shadow_percent is not None:
                changes["shadow_percent"] = float(shadow_percent) + 0.0
            self.traffic = TrafficSettings(**{**self.traffic.model_dump(), **changes})
            if canary is not False:
                self.canary = canary  # type: ignore[assignment]
            if shadow is not False:
                self.shadow = shadow  # type: ignore[assignment]
            if stable is not False:
                self.stable = stable  # type: ignore[assignment]
            return self.state()

    def set_state(self, state: dict[str, Any]) -> dict[str, object]:
        """Set the split from a mapping shaped like `state()` (mode, percentages, stable,
        canary, shadow): what a stored or remembered split is put back with."""
        return self.set_traffic(state["mode"], state["canary_percent"],
                                state["shadow_percent"], state["canary"], state["shadow"],
                                stable=state["stable"])

    def state(self) -> dict[str, object]:
        return {**self.traffic.model_dump(), "stable": self.stable, "canary": self.canary,
                "shadow": self.shadow, "arms": list(self.arms)}

    def add_arm(self, variant: str) -> None:
        """A new arm starts unpulled in every category's bandit."""
        with self._lock:
            if variant in self.arms:
                return
            self.arms.append(variant)
            old = self._bandits
            self._bandits = {}
            for cat, b in old.items():
                nb = self._make_bandit()
                for a, s in b.stats.items():
                    nb.stats[a] = s
                self._bandits[cat] = nb

    # ---- routing ----------------------------------------------------------------------------
    def sticky_key(self, interaction_id: str, user_id: str | None = None,
                   session_id: str | None = None) -> tuple[str, str]:
        """(kind, key) that decides the split for this request."""
        how = self.traffic.sticky
        if how == "user" and user_id:
            return "user", f"u:{user_id}"
        if how in ("user", "session") and session_id:
            return "session", f"s:{session_id}"
        return "request", f"r:{interaction_id}"

    def route(self, interaction_id: str, user_id: str | None = None,
              session_id: str | None = None, category: str | None = None) -> Decision:
        """Pick the variant answering this request (and the shadow it is mirrored to)."""
        with self._lock:
            t = self.traffic
            kind, key = self.sticky_key(interaction_id, user_id, session_id)
            if t.mode == "bandit":
                variant, p = self._bandit_pick(category)
                route = "bandit"
            elif self.canary and self.canary != self.stable and t.canary_percent > 0:
                on = bucket(key, t.salt) < t.canary_percent
                share = t.canary_percent / 100.0
                variant, route, p = ((self.canary, "canary", share) if on
                                     else (self.stable, "stable", 1.0 - share))
            else:
                variant, route, p = self.stable, "stable", 1.0
            shadow = None
            if (self.shadow and self.shadow != variant and t.shadow_percent > 0
                    and bucket(interaction_id, t.salt + ":shadow") < t.shadow_percent):
                shadow = self.shadow
            return Decision(variant, route, float(p), shadow, kind)

    # ---- bandit -----------------------------------------------------------------------------
    def category_key(self, category: str | None) -> str:
        cat = category or "default"
        if cat in self._bandits or len(self._bandits) < self.bandit_settings.max_categories:
            return cat
        return OTHER_CATEGORY

    def _make_bandit(self) -> Bandit:
        b = self.bandit_settings
        if b.algorithm == "thompson":
            return Thompson(self.arms, prior_mean=b.prior_mean, prior_sd=b.prior_sd,
                            noise_sd=b.noise_sd)
        return UCB1(self.arms, c=b.c)

    def _bandit_for(self, category: str | None) -> Bandit:
        cat = self.category_key(category)
        if cat not in self._bandits:
            self._bandits[cat] = self._make_bandit()
        return self._bandits[cat]

    def _bandit_pick(self, category: str | None) -> tuple[str, float]:
        probs = arm_probabilities(self._bandit_for(category), self._rng)
        arms = list(probs)
        p = np.array([probs[a] for a in arms])
        i = int(self._rng.choice(len(arms), p=p / p.sum()))
        return arms[i], float(p[i] / p.sum())

    def update(self, category: str | None, variant: str, reward: float) -> None:
        """Feed one reward in [0, 1] to the bandit of `category` (unknown arms are ignored:
        their pipeline was removed since)."""
        if not 0.0 <= reward <= 1.0:
            raise ConfigError("reward", f"must be in [0, 1], got {reward}")
        with self._lock:
            b = self._bandit_for(category)
            if variant in b.stats:
                b.update(variant, reward)

    def leaderboard(self, category: str | None = None) -> dict[str, list[dict[str, object]]]:
        """Per category: arm, pulls (rewarded), mean reward, 95% normal CI."""
        with self._lock:
            cats = [self.category_key(category)] if category else sorted(self._bandits)
            return {c: _clean(self._bandits[c].leaderboard()) if c in self._bandits
                    else _clean(self._make_bandit().leaderboard()) for c in cats}


def _clean(rows: list[dict]) -> list[dict[str, object]]:
    """NaN -> None (JSON has no NaN)."""
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in r.items()} for r in rows]
