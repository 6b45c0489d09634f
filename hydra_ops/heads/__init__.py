"""Attention-head plans and what is done with them: which heads each member keeps.

``plans`` holds :class:`~hydra_ops.heads.plans.HeadPlan` (layer -> the sorted heads kept, indices
into the unpruned model; its JSON form) and the head-set overlap; ``scores`` the importance of
every head, ``[layers, heads]`` (:class:`~hydra_ops.heads.scores.HeadScores`); ``gating``
multiplies each head's context by a gate (what the importance criteria differentiate);
``surgery`` removes heads physically; ``selection`` turns head scores into M diverse plans.
Imports point one way: ``plans`` <- ``scores`` <- ``selection``; ``plans`` <- ``surgery``;
``gating`` imports none of them. The package reads a model only through
:mod:`hydra_ops.adapters` and imports neither the merge, the training loop nor the UQ code; the
criteria that compute the scores (:mod:`hydra_ops.scoring`) build on it, never the other way
round.
"""
