"""The Hydra model: M pruned members fused into one network, and its saved form.

``grouped/`` holds the grouped layers over member-major ``[M, B, T, D]`` streams (attention
implementations by name, per-member linear / norm / MLP); ``positions/`` the relative-position
attention terms a family may add to every layer's scores (by name); ``ensemble`` the network,
:class:`~hydra_ops.hydra.ensemble.HydraEnsemble`, built from its ``architecture`` description
alone; ``merge`` builds it from pruned members (``merge_members``); ``format`` is what a saved
``hydra.json`` must hold (``check_hydra_config``); ``serialization`` saves and loads it with its
hashes. Imports point one way: ``positions`` <- ``grouped`` <- ``ensemble`` <- ``merge`` <-
``format`` <- ``serialization``. (The name is the model's, not the Hydra configuration framework's.)
"""
