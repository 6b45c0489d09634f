"""What every stage runs on: the entry point (:mod:`.stage`), the artifact layout, atomic outputs,
the DVC files, the prepared data, resumable units, the per-stage precision, each stage's code deps
(:mod:`.stage_deps`) and the checks the CLI runs before anything is written (:mod:`.preflight`).
Imports only :mod:`tasks.params` and :mod:`hydra_ops`."""
