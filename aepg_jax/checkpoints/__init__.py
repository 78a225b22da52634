"""Checkpoint formats: the published ViT `.npz` files (`augreg`) and the `inspect` command."""
