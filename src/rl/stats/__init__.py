"""Statistics: bootstrap CIs, permutation tests, power, group sequential tests, off-policy
evaluation and a seeded bandit simulator. Imports nothing else from `rl`."""
