"""Model adaptation: train new model variants from real supervision and the interaction log,
then hand them to the tuner and the bandit as arms (see docs/adaptation.md).

Each trained model is a config + trainer pair (TRL's `*_config.py` / `*_trainer.py` shape):

- reranker: `reranker_config` (`RerankerTrainConfig`) + `reranker_trainer` (`train_reranker`,
  `run_training`): a cross-encoder built from the packaged MiniLM weights (`reranker_model`),
  trained with a listwise (or margin) loss and a hard-negative curriculum, checkpointed and
  resumable, checked on a valid split (`reranker_eval`), saved as a versioned model and
  registered (`reranker_export`) so `reranker_model: <name>` selects it.
- generator: `generator_config` (`GeneratorSFTConfig`) + `generator_trainer` (`SFTRun`: LoRA
  SFT with exact resume); `generator_model` (loading, encoding, generation, F1 eval),
  `generator_export` (merge + registration), `prefs` (DPO / IPO / ORPO), `sft_data` (SFT
  examples).
- `data`: (query, gold passage, hard/easy negatives) items mined from train splits.

Both register through `rag.model_registry_writer` (atomic, versioned, `@best`).
"""
