"""Seeded corruptions: the shift set (character noise, image noise/rotation) and the OOD-validation
set for the circuit scorer (word-shuffled texts, patch/pixel-shuffled images)."""

from __future__ import annotations

import string

import numpy as np

NOISE_ALPHABET = string.ascii_lowercase + string.digits
CHAR_OPS = ("substitute", "delete", "insert", "swap")


def char_noise(text: str, severity: float, rng: np.random.Generator) -> tuple[str, int]:
    """Corrupt ``text`` character by character.

    Each position is edited with probability ``severity`` by one of substitute (a different
    character), delete, insert (a random character before it) or swap (with the next character,
    which is then consumed), chosen uniformly. Returns ``(noisy_text, number_of_edits)``; the
    expected number of edits is about ``severity * len(text)``.
    """
    if not 0.0 <= severity <= 1.0:
        raise ValueError(f"severity must be in [0, 1], got {severity}")
    out: list[str] = []
    edits = 0
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if rng.random() >= severity:
            out.append(ch)
            i += 1
            continue
        op = CHAR_OPS[int(rng.integers(len(CHAR_OPS)))]
        if op == "swap" and i + 1 >= n:
            op = "substitute"
        edits += 1
        if op == "substitute":
            choices = [c for c in NOISE_ALPHABET if c != ch.lower()]
            out.append(choices[int(rng.integers(len(choices)))])
        elif op == "insert":
            out.append(NOISE_ALPHABET[int(rng.integers(len(NOISE_ALPHABET)))])
            out.append(ch)
        elif op == "swap":
            out.append(text[i + 1])
            out.append(ch)
            i += 1
        # delete: append nothing
        i += 1
    return "".join(out), edits


def word_shuffle(text: str, rng: np.random.Generator) -> str:
    """The same words (whitespace tokens) in a random order: ID vocabulary, no ID syntax."""
    words = text.split()
    order = rng.permutation(len(words))
    return " ".join(words[i] for i in order)


def image_shift(
    images: np.ndarray, severity: float, kind: str, rng: np.random.Generator
) -> np.ndarray:
    """Covariate shift for uint8 images [N, H, W(, C)].

    ``rotation``: each image rotated by ``severity * 45`` degrees with a random sign (bilinear,
    zero fill); ``noise``: additive gaussian noise with std ``severity * 0.5`` (in [0, 1] pixel
    units), clipped; ``noise+rotation`` does both. Returns uint8 of the same shape.
    """
    from scipy.ndimage import rotate

    if kind not in ("noise", "rotation", "noise+rotation"):
        raise ValueError(f"shift_kind must be noise, rotation or noise+rotation, got {kind!r}")
    x = images.astype(np.float32) / 255.0
    if "rotation" in kind and severity > 0:
        signs = rng.choice([-1.0, 1.0], size=len(x))
        x = np.stack(
            [
                rotate(img, float(s * severity * 45.0), axes=(0, 1), reshape=False, order=1)
                for img, s in zip(x, signs, strict=True)
            ]
        )
    if "noise" in kind and severity > 0:
        x = x + rng.normal(0.0, severity * 0.5, size=x.shape).astype(np.float32)
    return np.clip(np.rint(x * 255.0), 0, 255).astype(np.uint8)


def patch_shuffle(images: np.ndarray, rng: np.random.Generator, grid: int = 4) -> np.ndarray:
    """Cut each image into ``grid x grid`` patches and permute them (per image).

    Needs H and W divisible by ``grid``; keeps local ID texture, destroys global shape.
    """
    n, h, w = images.shape[:3]
    if h % grid or w % grid:
        raise ValueError(f"patch_shuffle: image size {h}x{w} is not divisible by grid {grid}")
    ph, pw = h // grid, w // grid
    rest = images.shape[3:]
    patches = images.reshape(n, grid, ph, grid, pw, *rest).swapaxes(2, 3)
    patches = patches.reshape(n, grid * grid, ph, pw, *rest)
    out = np.empty_like(patches)
    for i in range(n):
        out[i] = patches[i][rng.permutation(grid * grid)]
    out = out.reshape(n, grid, grid, ph, pw, *rest).swapaxes(2, 3)
    return out.reshape(images.shape).copy()


def pixel_shuffle(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Permute each image's pixel positions (channels kept together): keeps only the histogram."""
    n, h, w = images.shape[:3]
    flat = images.reshape(n, h * w, *images.shape[3:])
    out = np.stack([f[rng.permutation(h * w)] for f in flat])
    return out.reshape(images.shape)
