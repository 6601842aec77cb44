"""Make the example of a model judged without labels: a small digit detector.

Writes ``data/canvases.npz``, inputs only (``x``: 32x32 canvases, each holding one digit scaled
to 16x16 at a random place over faint noise; no labels: what a model's owner often has at hand)
and ``model.keras``, a small detector with two outputs, ``boxes`` (the digit's box, ``[top,
left, bottom, right]`` as shares of the canvas) and ``class_scores`` (which digit), trained on
boxes and digits this script knows and does not write, saved by Keras 3. tfopt then optimizes
it as a user's file, each variant judged by how closely its boxes follow the baseline's own
(``eval.metric: fidelity``: the SNR against them); pruning learns the baseline's own outputs
(self-distillation: there are no labels to learn from):

    python examples/detector_without_labels/make.py
    tfopt run --config examples/detector_without_labels/config.yaml
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

HERE = Path(__file__).resolve().parent
SIZE = 32


def canvases(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every digit once on a canvas, its box and the digit."""
    digits = load_digits()
    rng = np.random.default_rng(seed)
    count = len(digits.images)
    x = rng.uniform(0, 0.15, size=(count, SIZE, SIZE, 1)).astype(np.float32)
    boxes = np.zeros((count, 4), dtype=np.float32)
    for row, image in enumerate(digits.images):
        big = np.kron(image / 16.0, np.ones((2, 2)))  # 16x16
        top, left = rng.integers(0, SIZE - 16, size=2)
        x[row, top:top + 16, left:left + 16, 0] = np.maximum(
            x[row, top:top + 16, left:left + 16, 0], big)
        rows, cols = np.nonzero(big > 0.3)
        boxes[row] = np.array([top + rows.min(), left + cols.min(),
                               top + rows.max() + 1, left + cols.max() + 1]) / SIZE
    return x, boxes, digits.target.astype(np.int32)


def main() -> None:
    """Write the inputs and train, then save, the model."""
    import keras
    from keras import layers

    x, boxes, digits = canvases()
    (HERE / "data").mkdir(exist_ok=True)
    np.savez(HERE / "data" / "canvases.npz", x=x)
    keras.utils.set_random_seed(0)
    image = keras.Input((SIZE, SIZE, 1), name="image")
    features = layers.Conv2D(16, 3, padding="same", activation="relu")(image)
    features = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(features)
    features = layers.Conv2D(64, 3, strides=2, padding="same", activation="relu")(features)
    features = layers.Flatten()(layers.Conv2D(64, 3, strides=2, padding="same",
                                              activation="relu")(features))
    hidden = layers.Dense(128, activation="relu")(features)
    model = keras.Model(image, {
        "boxes": layers.Dense(4, activation="sigmoid", name="boxes")(hidden),
        "class_scores": layers.Dense(10, name="class_scores")(hidden)})
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss={"boxes": "mse", "class_scores": keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True)}, loss_weights={"boxes": 50.0, "class_scores": 1.0})
    train = int(0.8 * len(x))
    model.fit(x[:train], {"boxes": boxes[:train], "class_scores": digits[:train]},
              epochs=30, batch_size=32, verbose=0)
    held_out = model.predict(x[train:], verbose=0)
    box_error = np.mean(np.abs(held_out["boxes"] - boxes[train:])) * SIZE
    accuracy = np.mean(np.argmax(held_out["class_scores"], axis=-1) == digits[train:])
    model.save(HERE / "model.keras")
    print(f"wrote {HERE / 'data'} ({len(x)} inputs, no labels) and {HERE / 'model.keras'} (held "
          f"out: boxes off by {box_error:.2f} px on average, digits {100 * accuracy:.1f}% right)")


if __name__ == "__main__":
    main()
