"""Statistics: bootstrap CIs, permutation tests, power, confidence sequences, off-policy
evaluation and a seeded bandit simulator. Imports nothing else from `rl`."""
