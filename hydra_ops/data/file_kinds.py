"""File kinds every data source shares: the suffixes read as images, the built-in far-OOD sets."""

#: File suffixes read as images: a folder source holding such files is an image source.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
#: The far-OOD sets any source may name in ``data.far_ood``.
FAR_OOD_BUILTINS = ("kaomoji", "sample_images", "noise", "mnist")
