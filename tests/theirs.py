"""Networks trained outside tfopt, for the end-to-end tests of the models users bring."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flows.parameters import load_pipeline_config
from tfopt.demo_data import write_demo_images

ROOT = Path(__file__).resolve().parents[1]


def their_keras3_network(folder: Path, epochs: int = 4) -> tuple[Path, object, float, object]:
    """A Keras 3 CNN trained outside tfopt on the smoke data (32 px, 10 classes).

    Built as people write one: batch norm, a depthwise-separable block with a residual add,
    `hard_swish` and a `keras.ops` operation, so its tf_keras translation has to follow all of
    them; small enough that the end-to-end runs stay short.

    Returns:
        The demo image folder, the Keras 3 model, its own test accuracy, and the data set it was
        trained on (tfopt's shards of the same folder and settings).
    """
    import keras

    from tasks.write_tfrecords import write_tfrecords
    from tfopt.data.pipeline import load_split

    demo = folder / "demo"
    write_demo_images(demo)
    smoke = load_pipeline_config(ROOT / "configs" / "smoke.yaml", {"data.source_dir": str(demo)})
    dataset = write_tfrecords.fn(smoke.data, folder / "outside")
    train_images, train_labels = load_split(dataset, "train")
    keras.utils.set_random_seed(1)
    inputs = keras.Input((32, 32, 3), name="pixels")
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("hard_swish")(x)
    branch = keras.layers.DepthwiseConv2D(3, padding="same")(x)
    branch = keras.layers.Conv2D(16, 1, activation="relu")(branch)
    x = keras.layers.Add()([x, branch * 0.5])
    x = keras.layers.Conv2D(32, 3, strides=2, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    network = keras.Model(inputs, keras.layers.Dense(10)(x), name="theirs")
    network.compile(optimizer=keras.optimizers.Adam(3e-3),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    network.fit(train_images, train_labels, epochs=epochs, batch_size=32, verbose=0)
    test_images, test_labels = load_split(dataset, "test")
    own_accuracy = float(np.mean(np.argmax(network.predict(test_images, verbose=0), 1)
                                 == test_labels))
    return demo, network, own_accuracy, dataset
