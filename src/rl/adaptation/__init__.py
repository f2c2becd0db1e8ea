"""Model adaptation: train new model variants from real supervision and the interaction log,
then hand them to the tuner and the bandit as arms (see docs/adaptation.md).

- `rl.adaptation.data`: (query, gold passage, hard/easy negatives) items mined from train splits.
- `rl.adaptation.reranker`: a cross-encoder reranker built from the packaged MiniLM weights,
  trained with a listwise (or margin) loss and a hard-negative curriculum, checkpointed and
  resumable, saved as a versioned model and registered so `reranker_model: <name>` selects it.
"""
