"""Benchmarks of the Hydra Ensemble against single models and Deep Ensembles (``python -m
benchmarks.run``; see docs/benchmarks.md)."""
