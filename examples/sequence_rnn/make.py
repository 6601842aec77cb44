"""Make the recurrent sequence example: scikit-learn's digits read row by row by a GRU.

Writes ``data/digits.npz`` (``x``: each 8x8 digit as a sequence of 8 rows of 8 pixels, ``y``:
the digit) and ``model/``, a plain SavedModel of a GRU classifier trained on the first 80% of
it (Keras 3's ``model.export``), beside this file. tfopt then optimizes the SavedModel as a
user's file, judged by top-1 accuracy on arrays:

    python examples/sequence_rnn/make.py
    tfopt run --config examples/sequence_rnn/config.yaml
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

HERE = Path(__file__).resolve().parent


def main() -> None:
    """Write the data and train, then export, the model."""
    import keras

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)  # [N, 8 rows, 8 pixels]
    y = digits.target.astype(np.int32)
    (HERE / "data").mkdir(exist_ok=True)
    np.savez(HERE / "data" / "digits.npz", x=x, y=y)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8), name="rows"), keras.layers.GRU(64),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    trained = int(0.8 * len(x))
    model.fit(x[:trained], y[:trained], epochs=30, batch_size=32, verbose=0)
    model.export(str(HERE / "model"), verbose=False)
    print(f"wrote {HERE / 'data'} ({len(x)} examples) and {HERE / 'model'} (accuracy on the "
          f"last 20%: {model.evaluate(x[trained:], y[trained:], verbose=0)[1]:.3f})")


if __name__ == "__main__":
    main()
