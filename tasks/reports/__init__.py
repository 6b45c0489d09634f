"""What people read after a run: ``reports/evaluate.md`` (:mod:`.evaluate_markdown`), the key
metrics and score histograms ``evaluate`` writes for it, the run report's figures and HTML page,
the offline page template for ``dvc plots show`` and DVC's plot templates (``plot_templates/``)."""
