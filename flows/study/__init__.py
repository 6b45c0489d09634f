"""The study: named variants x seeds, each (variant, seed) point a full pipeline run, judged
across seeds in one report (``hydra-ens study SPEC.yaml``, docs/study.md).

One module per job, imports pointing one way (``flow -> points -> spec``, ``flow -> report``):

* :mod:`flows.study.spec`: the spec (``SPEC.yaml``) loaded and validated, every point's params
  resolved (:func:`~flows.study.spec.load_study`, :func:`~flows.study.spec.study_points`);
* :mod:`flows.study.flow`: the Prefect flow ``hydra-study`` on a Dask cluster;
* :mod:`flows.study.points`: what one worker does for a point or a shared upstream, in its own
  clone, and which points the project already holds (experiment refs);
* :mod:`flows.study.worker_preload`: the Dask preload of the local workers;
* :mod:`flows.study.report`: the cross-run report (``study.md``, ``study.json``, figures), a pure
  function of the points' files.

A study is no DVC stage: it runs the pipeline's stages as DVC experiments, so it lives in
``flows/`` beside the pipeline flow, not in ``tasks/``. Importing this package imports nothing:
the spec and the report load without Prefect or Dask.
"""
