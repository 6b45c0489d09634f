"""``folder``: the user's folder of class sub-folders, of text files or of image files (the
files decide the modality)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hydra_ops.data.catalog.base import DataSource, register_source

if TYPE_CHECKING:
    from hydra_ops.data.raw import RawData
    from hydra_ops.data.spec import DataSpec


def load(spec: DataSpec) -> RawData:
    from hydra_ops.data import user_sources

    assert spec.path is not None
    if user_sources.folder_is_images(spec.path):
        raw = user_sources.load_image_folder(spec.path, spec.channels, spec.image_size)
    else:
        raw = user_sources.load_text_folder(spec.path)
    if spec.classes is not None:
        unknown = sorted(set(raw.names) - set(spec.classes))
        if unknown:
            raise ValueError(
                f"folder source {spec.path!r}: class folder(s) {unknown} "
                f"not in classes {spec.classes}"
            )
    return raw


SOURCE = register_source(
    DataSource(
        name="folder",
        modality="files",
        load=load,
        description="a folder of class sub-folders of text or image files (data.path)",
        needs_path=True,
    )
)
