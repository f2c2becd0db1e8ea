"""RLlib glue of the per-query PPO policy: a multi-head action distribution whose gated heads
(`rl.routing.heads.HeadLayout.gates`) get no gradient where they do not act, the PPO catalog
that hands it to RLlib's default PPO module, and the module spec.

`MaskedHeadsDistribution` is RLlib's `TorchMultiDistribution` (one child distribution per
head, flattened in sorted key order) with
    logp(a)   = sum_h m_h(a) * logp_h(a_h),   m_h(a) = 1 if head h acts given a's parent value
    entropy() = sum_h w_h * H_h,              w_h = P(parent opens h's gate), detached
    kl(q)     = sum_h w_h * KL_h(q)
so PPO's ratio, entropy bonus and KL ignore a fusion weight sampled with a non-hybrid variant,
or an abstain threshold sampled with a generator arm that has none. Ungated heads count fully.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.ppo.ppo_catalog import PPOCatalog
from ray.rllib.core.distribution.torch.torch_distribution import (
    TorchCategorical,
    TorchMultiDistribution,
)
from ray.rllib.utils.spaces.space_utils import flatten_space, get_base_struct_from_space

from rl.routing.heads import active_masks, gate_weights, masked_sum

GATES_KEY = "head_gates"
"""Model-config key that carries `HeadLayout.gates_spec()` to the catalog."""


class MaskedHeadsDistribution(TorchMultiDistribution):
    """See the module docstring. `gates`: head -> (parent head, parent values that open it)."""

    def __init__(self, child_distribution_struct: dict, gates: dict | None = None):
        super().__init__(child_distribution_struct)
        self.names = sorted(child_distribution_struct)
        self.gates = {h: (p, tuple(v)) for h, (p, v) in (gates or {}).items()}

    def _children(self) -> dict[str, Any]:
        return dict(zip(self.names, self._flat_child_distributions, strict=True))

    def _split(self, value: Any) -> dict[str, torch.Tensor]:
        if isinstance(value, dict):
            return {h: value[h] for h in self.names}
        sizes = [1 if isinstance(d, TorchCategorical) else d.sample().shape[-1]
                 for d in self._flat_child_distributions]
        return dict(zip(self.names, torch.split(value, sizes, dim=1), strict=True))

    def head_logps(self, value: Any) -> dict[str, torch.Tensor]:
        """Per-head log-probabilities of `value` (a dict of per-head actions)."""
        out = {}
        for h, v in self._split(value).items():
            d = self._children()[h]
            if isinstance(d, TorchCategorical) and v.dim() > 1 and v.shape[-1] == 1:
                v = v.squeeze(-1)
            out[h] = d.logp(v)
        return out

    def logp(self, value: Any) -> torch.Tensor:
        masks = active_masks(self._split(value), self.gates)
        return masked_sum(self.head_logps(value), masks)

    def _weights(self) -> dict[str, torch.Tensor]:
        ch = self._children()
        probs = {p: ch[p]._dist.probs for p, _ in self.gates.values()}
        return {h: w.detach() for h, w in gate_weights(probs, self.gates).items()}

    def entropy(self) -> torch.Tensor:
        return masked_sum({h: d.entropy() for h, d in self._children().items()},
                          self._weights())

    def kl(self, other: Any) -> torch.Tensor:
        return masked_sum({h: d.kl(o) for (h, d), o in zip(
            self._children().items(), other._flat_child_distributions, strict=True)},
            self._weights())

    @classmethod
    def from_logits(cls, logits: torch.Tensor, child_distribution_cls_struct: dict = None,
                    input_lens: list[int] = None, gates: dict | None = None, **kwargs: Any
                    ) -> MaskedHeadsDistribution:
        names = sorted(child_distribution_cls_struct)
        parts = torch.split(logits, list(input_lens), dim=-1)
        children = {h: child_distribution_cls_struct[h].from_logits(x)
                    for h, x in zip(names, parts, strict=True)}
        return cls(children, gates=gates)


class MaskedHeadsPPOCatalog(PPOCatalog):
    """PPO's catalog with `MaskedHeadsDistribution` for a Dict action space (gates from the
    model config's `head_gates`)."""

    def get_action_dist_cls(self, framework: str):
        space = self.action_space
        struct = get_base_struct_from_space(space)
        cls_struct = {h: self._get_dist_cls_from_action_space(action_space=s,
                                                              framework=framework)
                      for h, s in struct.items()}
        flat = flatten_space(space)
        lens = [int(cls_struct[h].required_input_dim(s))
                for h, s in zip(sorted(cls_struct), flat, strict=True)]
        gates = self._model_config_dict.get(GATES_KEY) or {}
        return MaskedHeadsDistribution.get_partial_dist_cls(
            space=space, child_distribution_cls_struct=cls_struct, input_lens=lens,
            gates=gates)


def module_spec(observation_space: Any, action_space: Any, hidden: list[int],
                gates: dict[str, list]) -> Any:
    """The RLModuleSpec of the policy: RLlib's default PPO torch module (MLP torso of
    `hidden`, separate value net) with `MaskedHeadsPPOCatalog`."""
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
        DefaultPPOTorchRLModule,
    )
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    return RLModuleSpec(module_class=DefaultPPOTorchRLModule, catalog_class=MaskedHeadsPPOCatalog,
                        observation_space=observation_space, action_space=action_space,
                        model_config={"fcnet_hiddens": list(hidden), "vf_share_layers": False,
                                      GATES_KEY: gates})
