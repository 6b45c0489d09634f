"""The release path after the DAG: the model's chain of custody and lineage (what a verdict is
bound to), what a bundle ships beside the model (preprocessing, model card), and the model
registry (GTO tags, version commits, a registered bundle got back from DVC's cache)."""
