"""Head importance scores: which attention heads of a fine-tuned model matter.

``score_heads(model, method, **kwargs)`` returns a :class:`HeadScores` whose ``scores`` is a float
tensor ``[layers, heads]``, higher = more important. ``method`` names a criterion in the registry
``SCORERS``; the built-ins (details in docs/scoring.md):

- ``taylor`` (:mod:`.taylor`): Michel et al. (2019). A per-example gate ``xi = 1`` multiplies every
  head's context before the output projection; importance = mean over training examples of
  ``|dL_i/dxi|``, ``L_i`` the example's cross-entropy; optionally L2-normalised per layer.
- ``circuit`` (:mod:`.circuit`): the layer-conditioned greedy circuit search of HeadMap (Wang et
  al., ICLR 2025), run ``num_circuits`` times with different objectives / validation bootstrap
  resamples / an overlap penalty so the circuits differ. ``scores`` is the mean importance over
  circuits, ``circuits`` the plans (one per circuit, ``heads_per_layer`` heads per layer).
- ``magnitude`` (:mod:`.magnitude`): per-head L2 norm of its q/k/v rows and output-projection
  columns.
- ``random`` (:mod:`.random_baseline`): seeded uniform noise, a baseline.

Criteria are small classes (options in the constructor, data in the call), as Torch-Pruning's
importance criteria: ``get_scorer("taylor", normalize=False)(model, train_batches=...)`` is
``TaylorImportance(normalize=False)(model, train_batches=...)``; ``register_scorer(name)`` adds
one. Every built-in runs the model in eval mode (dropout off) and restores its train/eval state,
and works on unpruned models only: every layer must have the same number of heads.
"""

from __future__ import annotations

from hydra_ops.heads.scores import HeadScores

from .base import (
    SCORERS,
    HeadImportance,
    ScorerArguments,
    get_scorer,
    register_scorer,
    score_heads,
    scorer_arguments,
)
from .circuit import DEFAULT_CIRCUIT_PENALTY, CircuitImportance, ProgressCallback, circuit_scores
from .inputs import Batch
from .magnitude import MagnitudeImportance, magnitude_scores
from .objectives import OBJECTIVES
from .random_baseline import RandomImportance, random_scores
from .taylor import TaylorImportance, taylor_scores

for _criterion in (TaylorImportance, CircuitImportance, MagnitudeImportance, RandomImportance):
    register_scorer(_criterion.name)(_criterion)

#: The built-in criteria, in registration order (``SCORERS`` also holds any registered later).
METHODS: tuple[str, ...] = tuple(SCORERS)

__all__ = [
    "DEFAULT_CIRCUIT_PENALTY",
    "METHODS",
    "OBJECTIVES",
    "SCORERS",
    "Batch",
    "CircuitImportance",
    "HeadImportance",
    "HeadScores",
    "MagnitudeImportance",
    "ProgressCallback",
    "RandomImportance",
    "ScorerArguments",
    "TaylorImportance",
    "circuit_scores",
    "get_scorer",
    "magnitude_scores",
    "random_scores",
    "register_scorer",
    "score_heads",
    "scorer_arguments",
    "taylor_scores",
]
