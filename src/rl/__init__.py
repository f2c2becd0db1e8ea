"""The control plane: tracking, statistics, tuning, rollout (rl may import rag, never serving)."""
