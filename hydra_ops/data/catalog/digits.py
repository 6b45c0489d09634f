"""``digits``: scikit-learn's 8x8 digits; digits 8 and 9 are the near-OOD set."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hydra_ops.data.catalog.base import DataSource, register_source

if TYPE_CHECKING:
    from hydra_ops.data.raw import RawData
    from hydra_ops.data.spec import DataSpec

DIGITS = tuple(str(i) for i in range(10))


def load(spec: DataSpec) -> RawData:
    from hydra_ops.data.sources import load_digits_source

    return load_digits_source()


SOURCE = register_source(
    DataSource(
        name="digits",
        modality="image",
        load=load,
        description="scikit-learn load_digits: 1,797 8x8 grayscale digits",
        classes=DIGITS,
        default_id_classes=DIGITS[:8],
    )
)
