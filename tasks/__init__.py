"""The pipeline's DVC stages. A module here named for a stage (``tasks/merge.py``, ...) is a **DVC
stage**, run as its own process by ``dvc repro`` (``python -m tasks.<stage>``, the ``cmd`` of
``dvc.yaml``), not a Prefect ``@task``: the Prefect tasks are in :mod:`flows.pipeline`, and each
runs one of these stages through DVC.

Each stage module reads its params view (:mod:`tasks.params`), calls the library
(:mod:`hydra_ops`) and writes its outputs atomically (:mod:`tasks.runtime.outputs`) through
:func:`tasks.runtime.stage.stage_main`. The top level holds only the stages; the packages beside
them are named for their job: what every stage runs on (:mod:`tasks.runtime`), the models
``evaluate`` compares (:mod:`tasks.candidates`) and what it computes (:mod:`tasks.evaluation`),
the reports (:mod:`tasks.reports`), the gate logic (:mod:`tasks.gates`), the release path
(:mod:`tasks.release`) and the prediction service (:mod:`tasks.serving`). docs/architecture.md
lists every module.
"""
