"""Training from scratch (paper Table 4): ResNet on CIFAR with a fixed CE/EPG mix."""
