"""The scoring kernel every consumer of the control plane shares: the tuner settings
(`settings.TunerSettings`), the config space (`space.ConfigSpace`) and its action codec
(`actions`), the reward and gates (`reward.RewardSpec`), the cost model (`cost_model`,
`cost_measure`) and the evaluator that scores a config on a split (`evaluator.TunerEvaluator`).

The tuner, the per-query policy, promotion and serving import it; it imports only `rag`,
`rl.common` and `rl.stats`."""
