"""The per-query config policy: an observation per question (`features`), the supervised
full-information router over a portfolio of configs and the per-segment lookup (`router`), and
the PPO policy with mixed action heads under a cost constraint (`ppo_policy`, with `heads`,
`ppo_module`, `worlds`, `settings`). Benchmark: `bench/policy.py`."""
