"""The built-in demo data: scikit-learn's handwritten digits as a class-per-folder JPEG tree.

scikit-learn ships the 1,797 labelled 8x8 digit images, so nothing is downloaded. They are
upscaled and written as RGB JPEGs (``<out>/<digit>/digit_<index>.jpg``), the same layout a user's
own folder has, so the pipeline reads them with exactly the code that reads real data.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from tfopt.fileio import atomic_write_text

_COMPLETE_MARKER = ".complete"


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

    marker = out_dir / _COMPLETE_MARKER
    if marker.exists():
        return int(marker.read_text().split()[0])
    digits = load_digits()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for index, (pixels, label) in enumerate(zip(digits.images, digits.target, strict=True)):
            class_dir = staging / str(label)
            class_dir.mkdir(exist_ok=True)
            (class_dir / f"digit_{index:04d}.jpg").write_bytes(
                digit_to_jpeg(pixels, image_size, quality)
            )
        count = len(digits.target)
        atomic_write_text(staging / _COMPLETE_MARKER, f"{count} images, {image_size}px\n")
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
