"""The gate logic the ``gate`` and ``promote`` stages run: one check judged on a model's metrics,
``any_of`` groups (:mod:`.twin`), every candidate judged and the one that ships
(:mod:`.candidates`). The gate's schema and default checks are :mod:`tasks.params.gates`."""
