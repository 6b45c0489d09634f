"""Training-time augmentation of image batches (the stored splits are never augmented)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_shift(
    pixel_values: torch.Tensor, max_shift: int, generator: torch.Generator
) -> torch.Tensor:
    """Translate each image by a random whole number of pixels, filling the vacated border with 0.

    Args:
        pixel_values: [B, C, H, W] float images.
        max_shift: k >= 0; each image's row and column offsets are drawn independently and
            uniformly from ``{-k, ..., k}`` (``0`` returns ``pixel_values`` itself). Must be
            smaller than H and W.
        generator: the torch generator the offsets are drawn from (same state, same output).

    Returns:
        [B, C, H, W], same dtype; every output pixel is an input pixel of the same image and
        channel, or 0 (the "pad by k, random crop" augmentation of MNIST training recipes).
    """
    if isinstance(max_shift, bool) or int(max_shift) != max_shift or max_shift < 0:
        raise ValueError(f"max_shift must be an integer >= 0, got {max_shift!r}")
    if pixel_values.ndim != 4:
        raise ValueError(
            f"pixel_values must be [B, C, H, W], got shape {tuple(pixel_values.shape)}"
        )
    k = int(max_shift)
    if k == 0:
        return pixel_values
    b, _, h, w = pixel_values.shape
    if k >= min(h, w):
        raise ValueError(f"max_shift {k} must be smaller than the image size {h}x{w}")
    padded = F.pad(pixel_values, (k, k, k, k))
    offsets = torch.randint(0, 2 * k + 1, (b, 2), generator=generator)
    rows = offsets[:, :1] + torch.arange(h)  # [B, H] rows of `padded` each output row reads
    cols = offsets[:, 1:] + torch.arange(w)  # [B, W]
    out = padded[torch.arange(b)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2).contiguous()  # advanced indexing put channels last
