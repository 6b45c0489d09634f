"""The pipeline's DVC stages. A module here named for a stage (``tasks/merge.py``, ...) is a **DVC
stage**, run as its own process by ``dvc repro`` (``python -m tasks.<stage>``, the ``cmd`` of
``dvc.yaml``), not a Prefect ``@task``: the Prefect tasks are in :mod:`flows.pipeline`, and each
runs one of these stages through DVC.

Each stage module reads its params view (:mod:`tasks.params`), calls the library
(:mod:`hydra_ops`) and writes its outputs atomically (:mod:`tasks.runtime.outputs`) through
:func:`tasks.runtime.stage.stage_main`. The other modules are what the stages share (artifact
layout, DVC files, lineage, units of resumable work, report rendering) and the model's life after
the DAG (bundle verification, the registry, serving, ``predict``). docs/architecture.md lists them.
"""
