"""The built-in data sets: the same folder on every machine, and digits-hard harder to read."""

from __future__ import annotations

import numpy as np
from PIL import Image

from tfopt.demo_data import write_built_in, write_demo_images, write_hard_digits


def _pixels(folder, size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    files = sorted(folder.rglob("*.jpg"))
    images = np.stack([np.asarray(Image.open(f).convert("L").resize((size, size)), np.float32)
                       .ravel() / 255.0 for f in files])
    return images, np.array([int(f.parent.name) for f in files])


def _linear_accuracy(folder) -> float:
    """What a linear model on raw pixels reads of a folder (held-out third)."""
    from sklearn.linear_model import LogisticRegression

    images, labels = _pixels(folder)
    order = np.random.default_rng(0).permutation(len(labels))
    images, labels = images[order], labels[order]
    cut = len(labels) * 2 // 3
    model = LogisticRegression(max_iter=300).fit(images[:cut], labels[:cut])
    return float(model.score(images[cut:], labels[cut:]))


def test_digits_hard_is_the_same_everywhere_and_far_harder_than_the_demo(tmp_path):
    hard = tmp_path / "hard"
    assert write_hard_digits(hard, image_size=32, copies=1) == 1797
    assert sorted(p.name for p in hard.iterdir() if p.is_dir()) == [str(d) for d in range(10)]
    again = tmp_path / "again"
    write_hard_digits(again, image_size=32, copies=1)
    first = sorted(hard.rglob("*.jpg"))[123]
    assert (again / first.relative_to(hard)).read_bytes() == first.read_bytes(), "seeded"
    assert write_hard_digits(hard, image_size=32, copies=1) == 1797, "written once, reused"
    easy = tmp_path / "easy"
    write_demo_images(easy)
    easy_accuracy, hard_accuracy = _linear_accuracy(easy), _linear_accuracy(hard)
    assert easy_accuracy > 0.9, easy_accuracy
    assert hard_accuracy < 0.5 * easy_accuracy, (easy_accuracy, hard_accuracy)
    assert write_built_in(tmp_path / "elsewhere") is None, "only the built-in folders"
