"""Make the segmentation example: scikit-learn's digits on a canvas, each pixel classified.

Writes ``data/canvases.npz`` (``x``: 32x32 canvases, each holding one digit scaled to 16x16 at a
random place over faint noise; ``y``: each pixel's class, 0 for the background and 1 + the digit
for the digit's strokes) and ``model.keras``, a small encoder-decoder trained on the first 80%
of it and saved by Keras 3 with its compiled loss, beside this file. tfopt then optimizes it as
a user's file, judged by the mean IoU of its per-pixel classes (channel pruning fine-tunes it
with that loss):

    python examples/segmentation/make.py
    tfopt run --config examples/segmentation/config.yaml
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

HERE = Path(__file__).resolve().parent
SIZE = 32


def canvases(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Every digit once on a canvas, and its per-pixel classes."""
    digits = load_digits()
    rng = np.random.default_rng(seed)
    count = len(digits.images)
    x = rng.uniform(0, 0.15, size=(count, SIZE, SIZE, 1)).astype(np.float32)
    y = np.zeros((count, SIZE, SIZE), dtype=np.int32)
    for row, (image, digit) in enumerate(zip(digits.images, digits.target, strict=True)):
        big = np.kron(image / 16.0, np.ones((2, 2)))  # 16x16
        top, left = rng.integers(0, SIZE - 16, size=2)
        x[row, top:top + 16, left:left + 16, 0] = np.maximum(
            x[row, top:top + 16, left:left + 16, 0], big)
        y[row, top:top + 16, left:left + 16][big > 0.3] = digit + 1
    return x, y


def main() -> None:
    """Write the data and train, then save, the model."""
    import keras
    from keras import layers

    x, y = canvases()
    (HERE / "data").mkdir(exist_ok=True)
    np.savez(HERE / "data" / "canvases.npz", x=x, y=y)
    keras.utils.set_random_seed(0)
    image = keras.Input((SIZE, SIZE, 1), name="image")
    near = layers.Conv2D(16, 3, padding="same", activation="relu")(image)
    far = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(near)
    far = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(far)
    far = layers.Conv2D(64, 3, padding="same", activation="relu")(far)
    up = layers.UpSampling2D(4)(far)
    joined = layers.Concatenate()([near, up])
    joined = layers.Conv2D(32, 3, padding="same", activation="relu")(joined)
    classes = layers.Conv2D(11, 1, name="classes")(joined)
    model = keras.Model(image, classes)
    model.compile(optimizer=keras.optimizers.Adam(2e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    train = int(0.8 * len(x))
    model.fit(x[:train], y[:train], epochs=30, batch_size=32, verbose=0)
    predicted = np.argmax(model.predict(x[train:], verbose=0), axis=-1)
    truth = y[train:]
    ious = [np.sum((predicted == c) & (truth == c)) / np.sum((predicted == c) | (truth == c))
            for c in range(11)]
    model.save(HERE / "model.keras")
    print(f"wrote {HERE / 'data'} ({len(x)} examples) and {HERE / 'model.keras'} "
          f"(held-out mean IoU {np.mean(ious):.3f})")


if __name__ == "__main__":
    main()
