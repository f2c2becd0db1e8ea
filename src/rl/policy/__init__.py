"""The per-query config policy: an observation per question (`features`), the supervised
full-information router over a portfolio of configs and the per-segment lookup (`router`).
Benchmark: `bench/policy.py`."""
