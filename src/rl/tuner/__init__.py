"""The tuner: config space, reward and gates, evaluator, env, PPO and search baselines, bandits,
the per-query adaptive policy, reports, and the one tuning run (`rl.tuner.run`)."""
