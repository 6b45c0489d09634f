"""What people read after a run: ``reports/evaluate.md`` (:mod:`.evaluate_markdown`), the key
metrics and score histograms ``evaluate`` writes for it, the run report's figures and HTML page,
the offline page template for ``dvc plots show``, DVC's plot templates (``plot_templates/``) and
the bundle's model card (:mod:`.model_card`)."""
