"""The release path after the DAG: the model's chain of custody and lineage (what a verdict is
bound to), the bundle format and what it ships beside the model (preprocessing), and the model
registry (GTO tags and version commits; git commands; a registered bundle got back from DVC's
cache)."""
