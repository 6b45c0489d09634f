"""The pipeline stages: one module per DVC stage (``python -m tasks.<stage>``), plus the params
schema and the pipeline-side plumbing (registry, lineage, bundle)."""
