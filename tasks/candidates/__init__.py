"""The models ``evaluate`` compares and may ship: the seed's baselines, the efficient ensembles,
the compared set (:mod:`.compared`), how a candidate other than the Hydra is exported, scored,
bundled and served."""
