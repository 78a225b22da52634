"""`import tensorflow` fails here as where it is not installed: for children and tests that must
show that a code path never needs TensorFlow, though this venv (or TFDS's) may hold it."""

from __future__ import annotations

import sys


class Hiding:
    """Wraps a meta path finder so that it finds no tensorflow (`find_spec` None)."""

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.finder, attr)


def hidden_meta_path() -> list:
    """`sys.meta_path` with every finder wrapped in `Hiding`."""
    return [Hiding(f) for f in sys.meta_path]
