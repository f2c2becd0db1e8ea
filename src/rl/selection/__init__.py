"""Episode-level context selection (LEADR-style): SelectionEnv, rewards, BC -> RAFT -> PPO.
See docs/selection.md."""
