"""Models: the ViT backbone (`vit`), PEFT modules (`peft`) and the growing head (`head`)."""
