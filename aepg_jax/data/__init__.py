"""Data: sources (TFDS, image folders, embedded), class-incremental splits, the decode-once
cache, the sharded loader and on-device augmentation."""
