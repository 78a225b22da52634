"""Pretraining a small ViT backbone for `model.init=pretrained`, and the backbones shipped."""
