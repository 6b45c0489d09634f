"""What a data source declares: :class:`DataSource`, and :data:`DATA_SOURCES`, the registry of
them (``data.name`` -> source). No numpy or torch here: a source's ``load`` imports what it
reads when it runs."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from hydra_ops.data.file_kinds import FAR_OOD_BUILTINS, IMAGE_EXTENSIONS
from hydra_ops.registry import Registry

if TYPE_CHECKING:
    from hydra_ops.data.raw import RawData
    from hydra_ops.data.spec import DataSpec

#: ``files``: the modality is the files' (a folder of images is an image source, else text).
Modality = Literal["text", "image", "files"]
MODALITIES: tuple[Modality, ...] = ("text", "image", "files")


@dataclass(frozen=True)
class DataSource:
    """One data source.

    Attributes:
        name: the ``data.name`` that selects it.
        modality: ``text``, ``image``, or ``files`` (decided by the files under ``data.path``).
        load: ``DataSpec -> RawData``, every labelled example of the source (no splitting).
        description: one line for listings and errors.
        needs_path: the source reads the user's ``data.path`` (a folder or a file).
        classes: the class names when fixed by the source, else None (read from the data).
        default_id_classes: the in-distribution classes when ``data.id_classes`` is not given
            (the others are the near-OOD set); None: every class (no near-OOD set by default).
        default_far_ood: the far-OOD set when ``data.far_ood`` is not given; None: the
            modality's (``kaomoji`` for text, ``sample_images`` for images).
    """

    name: str
    modality: Modality
    load: Callable[[DataSpec], RawData]
    description: str
    needs_path: bool = False
    classes: tuple[str, ...] | None = None
    default_id_classes: tuple[str, ...] | None = None
    default_far_ood: str | None = None

    def __post_init__(self) -> None:
        if self.modality not in MODALITIES:
            raise ValueError(
                f"data source {self.name!r}: modality must be one of {', '.join(MODALITIES)}, "
                f"got {self.modality!r}"
            )
        if self.default_id_classes is not None and self.classes is not None:
            unknown = sorted(set(self.default_id_classes) - set(self.classes))
            if unknown:
                raise ValueError(
                    f"data source {self.name!r}: default_id_classes {unknown} not in its classes"
                )
        if self.default_far_ood is not None and self.default_far_ood not in FAR_OOD_BUILTINS:
            raise ValueError(
                f"data source {self.name!r}: default_far_ood must be one of "
                f"{', '.join(FAR_OOD_BUILTINS)}, got {self.default_far_ood!r}"
            )


#: ``data.name`` -> :class:`DataSource`, in registration order.
DATA_SOURCES: Registry[DataSource] = Registry("data source")


def register_source(source: DataSource) -> DataSource:
    """Register ``source`` under its name (ValueError if the name is taken) and return it."""
    return DATA_SOURCES.register(source.name, source)


def data_source(name: str) -> DataSource:
    """The source named ``name``; one-line ValueError naming the registered ones."""
    if name not in DATA_SOURCES:
        raise ValueError(unknown_source_message(name))
    return DATA_SOURCES.get(name)


def unknown_source_message(name: object) -> str:
    built_in = [n for n, s in DATA_SOURCES.items() if not s.needs_path]
    user = [n for n, s in DATA_SOURCES.items() if s.needs_path]
    return (
        f"unknown data source {name!r}; built-in sources: {', '.join(built_in)}; "
        f"user sources: {', '.join(user)} (with path)"
    )


def data_modality(spec: DataSpec) -> str:
    """``"text"`` or ``"image"``: the source's modality; for a ``files`` source, that of the
    first file under ``spec.path`` in walk order, hidden files skipped, as the folder loader
    reads it (``"text"`` when there is none yet)."""
    modality = data_source(spec.name).modality
    if modality != "files":
        return modality
    if spec.path and Path(spec.path).is_dir():
        for _root, _, filenames in sorted(os.walk(spec.path)):
            for name in sorted(filenames):
                if not name.startswith("."):
                    return "image" if Path(name).suffix.lower() in IMAGE_EXTENSIONS else "text"
    return "text"
