"""The built-in data sets: scikit-learn's handwritten digits as class-per-folder JPEG trees.

scikit-learn ships the 1,797 labelled 8x8 digit images, so nothing is downloaded. They are
upscaled and written as RGB JPEGs (``<out>/<digit>/digit_<index>.jpg``), the same layout a user's
own folder has, so the pipeline reads them with exactly the code that reads real data.

The demo's digits are easy: a network reaches 0.99 on them, where an accuracy budget of one
point decides nothing. ``digits-hard`` (`write_hard_digits`) draws each digit again under a
random affine transform, in a random colour, over clutter cut from scikit-learn's two sample
photos, with strokes across it, part of it hidden and noise: data on which compression can cost
accuracy that shows.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from tfopt.fileio import atomic_write_text

_COMPLETE_MARKER = ".complete"
BUILT_IN_FOLDERS = {"demo": Path("data/demo"), "digits-hard": Path("data/digits-hard")}
"""Where the built-in data sets are written (the configs name these folders)."""


def write_built_in(folder: Path) -> int | None:
    """Write the built-in data set `folder` names, if it names one (None: it does not)."""
    if folder == BUILT_IN_FOLDERS["demo"]:
        return write_demo_images(folder)
    if folder == BUILT_IN_FOLDERS["digits-hard"]:
        return write_hard_digits(folder)
    return None


def write_demo_images(out_dir: Path, image_size: int = 32, quality: int = 95) -> int:
    """Write the digits data set as JPEG files, once; later calls reuse the finished folder.

    The folder is built under a temporary name and renamed when complete, so an interrupted
    call never leaves a half-written data set behind.

    Args:
        out_dir: Folder to create, holding one sub-folder per digit.
        image_size: Side of the written (square) images in pixels.
        quality: JPEG quality.

    Returns:
        The number of images in the folder.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    files = ((str(label), f"digit_{index:04d}.jpg", digit_to_jpeg(pixels, image_size, quality))
             for index, (pixels, label) in enumerate(zip(digits.images, digits.target,
                                                         strict=True)))
    return _write_once(out_dir, files, f"{image_size}px")


def write_hard_digits(out_dir: Path, image_size: int = 64, copies: int = 1, seed: int = 0,
                      quality: int = 90) -> int:
    """Write ``digits-hard``: each digit drawn `copies` times over clutter, once (see above).

    Every drawing is its own random draw (`hard_digit`) from `seed`, so the folder is the same
    on every machine; like `write_demo_images`, an interrupted call leaves nothing behind.

    Args:
        out_dir: Folder to create, holding one sub-folder per digit.
        image_size: Side of the written (square) images in pixels.
        copies: Drawings per digit of scikit-learn's 1,797.
        seed: The random draws' seed.
        quality: JPEG quality.

    Returns:
        The number of images in the folder.
    """
    from sklearn.datasets import load_digits, load_sample_images

    digits = load_digits()
    photos = [np.asarray(photo, np.float32) for photo in load_sample_images().images]
    rng = np.random.default_rng(seed)

    def drawn() -> Iterator[tuple[str, str, bytes]]:
        for copy in range(copies):
            for index, (pixels, label) in enumerate(zip(digits.images, digits.target,
                                                        strict=True)):
                rgb = hard_digit(pixels, image_size, rng, photos)
                buffer = io.BytesIO()
                Image.fromarray(rgb).save(buffer, format="JPEG", quality=quality)
                yield str(label), f"digit_{index:04d}_{copy}.jpg", buffer.getvalue()

    return _write_once(out_dir, drawn(), f"{image_size}px, {copies} drawings per digit, "
                                         f"seed {seed}")


def hard_digit(pixels: np.ndarray, image_size: int, rng: np.random.Generator,
               photos: list[np.ndarray]) -> np.ndarray:
    """One 8x8 digit drawn hard to read: an ``image_size`` RGB image (uint8).

    The digit is scaled, rotated, sheared and moved at random, inked in a light random tint over
    a crop of a sample photo (darkened, its contrast lowered), crossed by strokes, partly hidden
    by a patch of another crop, and noised.
    """
    size = image_size
    background = _photo_crop(photos, size, rng)
    ink_mask = _transformed_digit(pixels, size, rng)
    ink = rng.uniform(170, 255, 3)
    opacity = rng.uniform(0.75, 1.0)
    canvas = background * (1 - ink_mask[..., None] * opacity) + ink * (
        ink_mask[..., None] * opacity)
    canvas = _with_strokes(canvas, size, rng)
    if rng.random() < 0.3:
        canvas = _with_patch(canvas, _photo_crop(photos, size, rng), size, rng)
    canvas += rng.normal(0.0, rng.uniform(3.0, 12.0), canvas.shape)
    return np.clip(canvas, 0, 255).astype(np.uint8)


def _photo_crop(photos: list[np.ndarray], size: int, rng: np.random.Generator) -> np.ndarray:
    """A random square crop of a sample photo at `size`, its channels shuffled, contrast low."""
    photo = photos[rng.integers(len(photos))]
    side = int(rng.integers(size, min(photo.shape[:2]) // 2))
    top = int(rng.integers(0, photo.shape[0] - side))
    left = int(rng.integers(0, photo.shape[1] - side))
    crop = Image.fromarray(photo[top:top + side, left:left + side].astype(np.uint8))
    pixels = np.asarray(crop.resize((size, size), Image.BILINEAR), np.float32)
    pixels = pixels[..., rng.permutation(3)]
    mean = pixels.mean()
    return (mean + (pixels - mean) * rng.uniform(0.25, 0.6)) * rng.uniform(0.3, 0.7)


def _transformed_digit(pixels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """The digit as a [0, 1] mask at `size`: scaled, rotated, sheared and moved at random."""
    gray = Image.fromarray(np.clip(pixels * (255.0 / 16.0), 0, 255).astype(np.uint8), mode="L")
    scale = rng.uniform(0.55, 0.9)
    side = max(8, int(size * scale))
    digit = gray.resize((side, side), Image.BICUBIC)
    digit = digit.transform(digit.size, Image.AFFINE,
                            (1.0, rng.uniform(-0.3, 0.3), 0.0, 0.0, 1.0, 0.0), Image.BICUBIC)
    digit = digit.rotate(rng.uniform(-25.0, 25.0), Image.BICUBIC, expand=True)
    canvas = Image.new("L", (size, size))
    room = max(0, size - digit.size[0]), max(0, size - digit.size[1])
    canvas.paste(digit, (int(rng.integers(0, room[0] + 1)), int(rng.integers(0, room[1] + 1))))
    return np.asarray(canvas, np.float32) / 255.0


def _with_strokes(canvas: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """`canvas` crossed by one to three straight strokes of random colours."""
    from PIL import ImageDraw

    image = Image.fromarray(np.clip(canvas, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(0, 3))):
        start, end = rng.uniform(0, size, 2), rng.uniform(0, size, 2)
        draw.line([tuple(start), tuple(end)], fill=tuple(int(v) for v in rng.uniform(0, 255, 3)),
                  width=int(rng.integers(1, max(2, size // 16))))
    return np.asarray(image, np.float32)


def _with_patch(canvas: np.ndarray, patch: np.ndarray, size: int,
                rng: np.random.Generator) -> np.ndarray:
    """`canvas` with a rectangle (an eighth to a fifth of it) taken from `patch`."""
    height, width = (int(size * rng.uniform(0.2, 0.4)) for _ in range(2))
    top, left = int(rng.integers(0, size - height)), int(rng.integers(0, size - width))
    hidden = canvas.copy()
    hidden[top:top + height, left:left + width] = patch[top:top + height, left:left + width]
    return hidden


def _write_once(out_dir: Path, files: Iterable[tuple[str, str, bytes]], facts: str) -> int:
    """Write ``<out_dir>/<label>/<name>`` from `files` once; later calls reuse the folder.

    Returns:
        The number of files in the folder.
    """
    marker = out_dir / _COMPLETE_MARKER
    if marker.exists():
        return int(marker.read_text().split()[0])
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        count = 0
        for label, name, data in files:
            class_dir = staging / label
            class_dir.mkdir(exist_ok=True)
            (class_dir / name).write_bytes(data)
            count += 1
        atomic_write_text(staging / _COMPLETE_MARKER, f"{count} images, {facts}\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return count


def digit_to_jpeg(pixels: np.ndarray, image_size: int, quality: int = 95) -> bytes:
    """Encode one 8x8 digit (values 0..16) as an upscaled RGB JPEG.

    Args:
        pixels: The 8x8 intensity array from `load_digits`.
        image_size: Output side in pixels.
        quality: JPEG quality.

    Returns:
        The JPEG file's bytes.
    """
    gray = np.clip(pixels * (255.0 / 16.0), 0, 255).astype(np.uint8)
    image = Image.fromarray(gray, mode="L").resize((image_size, image_size), Image.BICUBIC)
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def write_varied_digit_jpegs(root: Path, count: int, size: int, seed: int = 0) -> None:
    """Write `count` distinct digit JPEGs of `size` x `size` pixels under `root/<digit>/`."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    for index in range(count):
        source = index % len(digits.target)
        label = digits.target[source]
        gray = np.clip(digits.images[source] * (255.0 / 16.0), 0, 255).astype(np.uint8)
        image = Image.fromarray(gray, mode="L").resize((size, size), Image.BICUBIC)
        pixels = np.asarray(image, np.float32) * rng.uniform(0.7, 1.0)
        pixels = np.roll(pixels, tuple(rng.integers(-3, 4, size=2)), axis=(0, 1))
        pixels += rng.normal(0.0, 8.0, pixels.shape)
        rgb = np.repeat(np.clip(pixels, 0, 255).astype(np.uint8)[..., None], 3, axis=2)
        buffer = io.BytesIO()
        Image.fromarray(rgb).save(buffer, format="JPEG", quality=90)
        class_dir = root / str(label)
        class_dir.mkdir(parents=True, exist_ok=True)
        (class_dir / f"img_{index:06d}.jpg").write_bytes(buffer.getvalue())
