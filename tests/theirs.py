"""Networks trained outside tfopt, for the end-to-end tests of the models users bring."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flows.parameters import load_pipeline_config
from tfopt.demo_data import write_demo_images

ROOT = Path(__file__).resolve().parents[1]


def their_keras3_network(folder: Path, epochs: int = 2) -> tuple[Path, object, float, object]:
    """A Keras 3 MobileNetV2 (alpha 0.35, 32 px) trained outside tfopt on the smoke data.

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
    network = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35,
                                             weights=None, classes=10,
                                             classifier_activation=None)
    for layer in network.layers:  # from scratch, the applications' 0.999 keeps BN near init
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.9
    network.compile(optimizer=keras.optimizers.Adam(3e-3),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    network.fit(train_images, train_labels, epochs=epochs, batch_size=32, verbose=0)
    test_images, test_labels = load_split(dataset, "test")
    own_accuracy = float(np.mean(np.argmax(network.predict(test_images, verbose=0), 1)
                                 == test_labels))
    return demo, network, own_accuracy, dataset
