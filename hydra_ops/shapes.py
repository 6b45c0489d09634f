"""Default shapes of the models hydra_ops builds from scratch (no torch import: the pipeline's
params schema reads them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VitShape:
    """The from-scratch timm ViT's shape; its defaults are the one default for library and
    pipeline (``tasks/params.py``'s ``model.vit`` reads them from here)."""

    image_size: int = 16
    patch_size: int = 4
    embed_dim: int = 96
    depth: int = 4
    num_heads: int = 6
    mlp_ratio: float = 2.0


VIT_DEFAULTS = VitShape()
