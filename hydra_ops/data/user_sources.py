"""The user's sources: a folder of class sub-folders (texts or images), a CSV / JSON Lines table,
and a user OOD set. Each is read into :class:`~hydra_ops.data.raw.RawData` and checked at the
boundary (one-line ValueError naming the path and what is wrong).
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np

from hydra_ops.data.file_kinds import IMAGE_EXTENSIONS
from hydra_ops.data.raw import RawData, _first, check_texts
from hydra_ops.messages import one_line


def _require_dir(path: str | os.PathLike[str], what: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{what}: path {str(p)!r} does not exist")
    if not p.is_dir():
        raise ValueError(f"{what}: path {str(p)!r} is not a folder")
    return p


def _require_file(path: str | os.PathLike[str], what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{what}: file {str(p)!r} does not exist")
    return p


def _class_folders(root: Path, what: str) -> list[Path]:
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise ValueError(f"{what}: folder {str(root)!r} has no class sub-folders")
    for f in folders:
        if not any(c.is_file() and not c.name.startswith(".") for c in f.iterdir()):
            raise ValueError(f"{what}: class folder {str(f)!r} is empty")
    return folders


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS


def load_text_folder(root: str | os.PathLike[str], what: str = "folder source") -> RawData:
    """Class sub-folders of text files via ``sklearn.datasets.load_files`` (undecodable bytes
    replaced)."""
    from sklearn.datasets import load_files

    folder = _require_dir(root, what)
    _class_folders(folder, what)
    bunch = load_files(str(folder), encoding="utf-8", decode_error="replace", shuffle=False)
    files = [str(Path(f).relative_to(folder)) for f in bunch.filenames]
    check_texts([str(t) for t in bunch.data], files, what, f"folder {str(folder)!r}")
    return RawData(
        names=[str(n) for n in bunch.target_names],
        labels=np.asarray(bunch.target, dtype=np.int64),
        texts=[str(t) for t in bunch.data],
        description=f"text folder {str(folder)!r}",
    )


def read_image_file(
    path: Path, channels: int, image_size: int | None, what: str = "image"
) -> np.ndarray:
    """One image as uint8 [H, W] (channels 1) or [H, W, 3], resized to image_size if given.

    A file PIL cannot open or decode (not an image, truncated, too large) is a one-line
    ValueError naming the file.
    """
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = im.convert("L" if channels == 1 else "RGB")
            if image_size is not None and im.size != (image_size, image_size):
                im = im.resize((image_size, image_size), Image.Resampling.BILINEAR)
            return np.asarray(im, dtype=np.uint8)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        # UnidentifiedImageError is an OSError; truncated files raise OSError on convert()
        detail = one_line(exc).replace(f" {str(path)!r}", "")  # PIL repeats the path
        raise ValueError(
            f"{what}: cannot read image file {str(path)!r} ({detail}); remove or replace it"
        ) from None


def stack_images(arrays: list[np.ndarray], files: list[Path], what: str) -> np.ndarray:
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ValueError(
            f"{what}: images have different sizes {sorted(shapes)[:3]}...; set image_size "
            f"(e.g. image_size: 28) to resize them (first file {str(files[0])!r})"
        )
    return np.stack(arrays).astype(np.uint8)


def load_image_folder(
    root: str | os.PathLike[str],
    channels: int = 1,
    image_size: int | None = None,
    what: str = "folder source",
) -> RawData:
    """Class sub-folders of image files -> uint8 images."""
    folder = _require_dir(root, what)
    names, labels, arrays, files = [], [], [], []
    for idx, cls in enumerate(_class_folders(folder, what)):
        names.append(cls.name)
        images = [f for f in sorted(cls.iterdir()) if f.is_file() and _is_image(f)]
        if not images:
            raise ValueError(
                f"{what}: class folder {str(cls)!r} has no image files "
                f"({', '.join(IMAGE_EXTENSIONS)})"
            )
        for f in images:
            arrays.append(read_image_file(f, channels, image_size, what))
            labels.append(idx)
            files.append(f)
    return RawData(
        names=names,
        labels=np.asarray(labels, dtype=np.int64),
        images=stack_images(arrays, files, what),
        description=f"image folder {str(folder)!r}",
    )


def folder_is_images(root: str | os.PathLike[str]) -> bool:
    """True when the first regular file found under ``root`` has an image extension (the rule
    of :func:`hydra_ops.data.catalog.data_modality`)."""
    for dirpath, _, filenames in sorted(os.walk(root)):
        for name in sorted(filenames):
            if not name.startswith("."):
                return _is_image(Path(dirpath) / name)
    return False


def read_table(
    path: str | os.PathLike[str], kind: str, text_column: str, label_column: str | None, what: str
) -> tuple[list[str], list[str] | None]:
    """Texts (and labels as strings, when ``label_column``) from a CSV or JSONL file."""
    p = _require_file(path, what)
    texts: list[str] = []
    labels: list[str] = []
    lines: list[int] = []  # the file line each row ends on (a row is one line unless quoted)
    with p.open(encoding="utf-8", errors="replace", newline="") as fh:
        if kind == "csv":
            reader = csv.DictReader(fh)
            columns = reader.fieldnames or []
            needed = [text_column] + ([label_column] if label_column else [])
            missing = [c for c in needed if c not in columns]
            if missing:
                raise ValueError(
                    f"{what}: CSV {str(p)!r} lacks column(s) {missing}; it has {columns}"
                )
            rows = []
            for row in reader:
                rows.append(row)
                lines.append(reader.line_num)
        else:
            rows = []
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(
                        f"{what}: {str(p)!r} line {lineno} is not JSON: {exc}"
                    ) from None
                if (
                    not isinstance(row, dict)
                    or text_column not in row
                    or (label_column and label_column not in row)
                ):
                    raise ValueError(
                        f"{what}: {str(p)!r} line {lineno} needs keys {text_column!r}"
                        + (f" and {label_column!r}" if label_column else "")
                    )
                rows.append(row)
                lines.append(lineno)
    for row in rows:
        texts.append("" if row[text_column] is None else str(row[text_column]))
        if label_column:
            labels.append("" if row[label_column] is None else str(row[label_column]).strip())
    if not texts:
        raise ValueError(f"{what}: {str(p)!r} has no rows")
    where = [f"line {n}" for n in lines]
    check_texts(texts, where, what, f"{str(p)!r} column {text_column!r}")
    no_label = [where[i] for i, lab in enumerate(labels) if not lab]
    if no_label:
        raise ValueError(
            f"{what}: {str(p)!r} column {label_column!r} is empty at {len(no_label)} row(s) "
            f"({_first(no_label)}); every row needs a label"
        )
    return texts, (labels if label_column else None)


def load_table(
    path: str, kind: str, text_column: str, label_column: str, classes: list[str] | None
) -> RawData:
    """A CSV/JSONL of ``text,label`` -> RawData; ``classes`` (if given) fixes the allowed labels."""
    texts, labels = read_table(path, kind, text_column, label_column, f"{kind} source")
    assert labels is not None
    names = list(classes) if classes is not None else sorted(set(labels))
    index = {n: i for i, n in enumerate(names)}
    unknown = sorted(set(labels) - set(index))
    if unknown:
        raise ValueError(f"{kind} source {path!r}: label(s) {unknown[:5]} not in classes {names}")
    empty = [n for n in names if n not in set(labels)]
    if empty:
        raise ValueError(f"{kind} source {path!r}: class(es) {empty} have no examples")
    return RawData(
        names=names,
        labels=np.asarray([index[lab] for lab in labels], dtype=np.int64),
        texts=texts,
        description=f"{kind} file {path!r} (text={text_column!r}, label={label_column!r})",
    )


def load_ood_source(
    kind: str,
    path: str,
    text_column: str,
    modality: str,
    channels: int,
    image_size: tuple[int, int] | None,
    what: str,
) -> tuple[list[str] | None, np.ndarray | None]:
    """A user OOD set: ``(texts, None)`` or ``(None, images)``; labels are ignored."""
    if kind in ("csv", "jsonl"):
        if modality != "text":
            raise ValueError(f"{what}: a {kind} OOD set holds texts but the ID data are images")
        texts, _ = read_table(path, kind, text_column, None, what)
        return texts, None
    root = _require_dir(path, what)
    files = sorted(Path(d) / f for d, _, fs in os.walk(root) for f in fs if not f.startswith("."))
    if not files:
        raise ValueError(f"{what}: folder {str(root)!r} has no files")
    if modality == "text":
        texts = [f.read_bytes().decode("utf-8", errors="replace") for f in files]
        check_texts(texts, [str(f.relative_to(root)) for f in files], what, f"folder {str(root)!r}")
        return texts, None
    images = [f for f in files if _is_image(f)]
    if not images:
        raise ValueError(f"{what}: folder {str(root)!r} has no image files ({IMAGE_EXTENSIONS})")
    from PIL import Image

    arrays = []
    for f in images:
        a = read_image_file(f, channels, None, what)
        if image_size is not None and a.shape[:2] != image_size:
            im = Image.fromarray(a).resize(
                (image_size[1], image_size[0]), Image.Resampling.BILINEAR
            )
            a = np.asarray(im, np.uint8)
        arrays.append(a)
    return None, stack_images(arrays, images, what)
