"""The pipeline stages: one module per DVC stage (``python -m tasks.<stage>``), plus its params schema."""
