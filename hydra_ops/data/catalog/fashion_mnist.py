"""``fashion-mnist``: Debian's ``dataset-fashion-mnist``, 70,000 28x28 images in 10 classes;
``shirt`` (which resembles ``tshirt_top``, ``pullover`` and ``coat``) is the near-OOD set and
MNIST digits the far-OOD set."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hydra_ops.data.catalog.base import DataSource, register_source

if TYPE_CHECKING:
    from hydra_ops.data.raw import RawData
    from hydra_ops.data.spec import DataSpec

#: The classes in label order ('T-shirt/top', 'Ankle boot' as safe names).
CLASSES = (
    "tshirt_top",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle_boot",
)


def load(spec: DataSpec) -> RawData:
    from hydra_ops.data.sources import load_fashion_mnist

    return load_fashion_mnist(CLASSES)


SOURCE = register_source(
    DataSource(
        name="fashion-mnist",
        modality="image",
        load=load,
        description="Fashion-MNIST (Debian dataset-fashion-mnist): 70,000 28x28 images",
        classes=CLASSES,
        default_id_classes=tuple(c for c in CLASSES if c != "shirt"),
        default_far_ood="mnist",
    )
)
