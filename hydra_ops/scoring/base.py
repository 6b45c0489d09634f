"""What every head-importance criterion shares: the criterion base class and the registry.

A criterion is a small class in the manner of Torch-Pruning's importance criteria: its options go
to the constructor (``TaylorImportance(normalize=False)``), the data to the call
(``criterion(model, train_batches=...) -> HeadScores``, the result type of
:mod:`hydra_ops.heads.scores`). Criteria are registered by name
(``register_scorer``) and built by name (``get_scorer``); :func:`score_heads` is the facade.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple, TypeVar

from torch import nn

from hydra_ops.heads.scores import HeadScores
from hydra_ops.registry import Registry


# ----------------------------------------------------------------------------------------------
# The criterion
# ----------------------------------------------------------------------------------------------
class HeadImportance(abc.ABC):
    """A head-importance criterion: options in the constructor, data in the call.

    Subclasses declare their options as constructor keywords (the built-ins are frozen dataclasses:
    fields = options) and their data as named keywords of ``__call__`` after ``model`` (e.g.
    ``train_batches``); :func:`score_heads` routes a keyword by those names. The call scores every
    head of an unpruned ``model`` and returns ``HeadScores`` with ``scores`` ``[L, H]``.
    """

    #: the registry name, set by :func:`register_scorer`
    name: ClassVar[str] = ""

    @abc.abstractmethod
    def __call__(self, model: nn.Module, **data: Any) -> HeadScores:
        """Score every head of ``model`` from ``data`` (batch iterables, by keyword)."""

    def options(self) -> dict[str, Any]:
        """The options this criterion was built with (a dataclass's fields), by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# ----------------------------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------------------------
#: Registered criteria, name -> class, in registration order (the built-ins first).
SCORERS: Registry[type[HeadImportance]] = Registry("scorer")

_C = TypeVar("_C", bound=type)


class ScorerArguments(NamedTuple):
    """The keywords a registered criterion takes: constructor ``options``, call ``data``."""

    options: tuple[str, ...]
    data: tuple[str, ...]


def register_scorer(name: str) -> Callable[[_C], _C]:
    """Class decorator: register a criterion under ``name`` (ValueError if the name is taken).

    The class must define ``__call__(self, model, *, <data>=...) -> HeadScores``; subclassing
    :class:`HeadImportance` is the usual way. Its ``name`` attribute is set to ``name``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if name in SCORERS:
        raise ValueError(f"scorer {name!r} is already registered; registered: {', '.join(SCORERS)}")

    def register(cls: _C) -> _C:
        if not isinstance(cls, type) or not any("__call__" in vars(k) for k in cls.__mro__[:-1]):
            raise ValueError(f"register_scorer({name!r}) needs a class that defines __call__")
        cls.name = name  # type: ignore[attr-defined]
        return SCORERS.register(name, cls)

    return register


def _lookup(name: str, argument: str) -> type[HeadImportance]:
    return SCORERS.get(name, argument)


def _keywords(params: list[inspect.Parameter]) -> tuple[str, ...]:
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in params if p.kind in kinds)


def scorer_arguments(name: str) -> ScorerArguments:
    """The option and data keywords of the criterion registered as ``name``."""
    cls = _lookup(name, "name")
    init = list(inspect.signature(cls).parameters.values())
    call = list(inspect.signature(cls.__call__).parameters.values())[2:]  # after self, model
    return ScorerArguments(_keywords(init), _keywords(call))


def _reject_unknown(name: str, given: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = [key for key in given if key not in allowed]
    if unknown:
        raise ValueError(
            f"scorer {name!r} does not take {', '.join(unknown)}; "
            f"allowed: {', '.join(allowed) or 'nothing'}"
        )


def get_scorer(name: str, **options: Any) -> HeadImportance:
    """The criterion registered as ``name``, built with ``options``.

    ValueError naming the registered criteria for an unknown ``name``, or naming the criterion's
    options for an option it does not take.
    """
    cls = _lookup(name, "name")
    _reject_unknown(name, options, scorer_arguments(name).options)
    return cls(**options)


def score_heads(model: nn.Module, method: str, **kwargs: Any) -> HeadScores:
    """Score every attention head of ``model`` with the criterion registered as ``method``.

    ``kwargs`` are the criterion's data (e.g. ``train_batches``) and options (e.g. ``normalize``),
    told apart by name (:func:`scorer_arguments`); a keyword the criterion does not take is a
    ValueError naming the ones it does. Same as ``get_scorer(method, **options)(model, **data)``.
    Batches follow docs/architecture.md; they are cached on the model's device once.
    """
    _lookup(method, "method")
    args = scorer_arguments(method)
    _reject_unknown(method, kwargs, args.data + args.options)
    data = {key: value for key, value in kwargs.items() if key in args.data}
    options = {key: value for key, value in kwargs.items() if key not in args.data}
    return get_scorer(method, **options)(model, **data)
