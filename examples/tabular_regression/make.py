"""Make the tabular regression example: scikit-learn's diabetes data and a trained Keras 3 MLP.

Writes ``data/diabetes.npz`` (``x``: 10 standardized features, ``y``: the disease progression
a year later) and ``model.keras``, a small network trained on it and saved by Keras 3 with its
compiled loss, beside this file. tfopt then optimizes it as a user's file (its forms from a
SavedModel of its own signature; pruning fine-tunes it with that loss):

    python examples/tabular_regression/make.py
    tfopt run --config examples/tabular_regression/config.yaml
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.datasets import load_diabetes

HERE = Path(__file__).resolve().parent


def main() -> None:
    """Write the data and train, then save, the model."""
    import keras

    features, targets = load_diabetes(return_X_y=True)
    x = ((features - features.mean(0)) / features.std(0)).astype(np.float32)
    y = targets.astype(np.float32)
    (HERE / "data").mkdir(exist_ok=True)
    np.savez(HERE / "data" / "diabetes.npz", x=x, y=y)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((x.shape[1],), name="features"),
                              keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(1), keras.layers.Reshape(())])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", metrics=["mae"])
    model.fit(x, y, epochs=150, batch_size=32, verbose=0)
    model.save(HERE / "model.keras")
    print(f"wrote {HERE / 'data'} ({len(x)} examples) and {HERE / 'model.keras'} "
          f"(training MAE {model.evaluate(x, y, verbose=0)[1]:.1f})")


if __name__ == "__main__":
    main()
