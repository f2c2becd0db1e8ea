"""Per-query routing: which config of a portfolio answers each question. An observation per
question (`features`), the supervised full-information router and the per-segment lookup
(`router`), the PPO policy with mixed action heads under a cost constraint (`ppo_policy`, with
`heads`, `ppo_module`, `worlds`, `settings`), bandits over the portfolio's arms
(`portfolio_bandit`), decision logs (`decision_log`), and training a servable policy directory
(`train`, `train_ppo`). Benchmark: `bench/policy.py`."""
