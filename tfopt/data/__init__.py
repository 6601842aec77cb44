"""Data: the source folder's listing, TFRecord shards and their manifest, tf.data readers."""
