"""What every control-plane concern shares: the Ray runtime, memoised retrieval, code
fingerprints, MLflow tracking and the dataset bundle."""
