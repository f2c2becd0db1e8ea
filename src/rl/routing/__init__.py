"""Per-query routing: which config of a portfolio answers each question. An observation per
question (`features`), the supervised full-information router and the per-segment lookup
(`router`), the PPO policy with mixed action heads under a cost constraint (`ppo_policy`, with
`heads`, `ppo_module`, `worlds`, `settings`), training a servable policy directory
(`train`, `train_ppo`), and the Serve app's bandit router over served configs (`arm_bandit`)."""
