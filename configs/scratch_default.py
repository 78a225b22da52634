r"""Embedded from-scratch example: a small ResNet on Fashion-MNIST, offline on a CPU.

The paper's Table 4 setting (SGD momentum 0.9, lr 0.1 with a x0.1 step, fixed mix
`alpha CE + (1 - alpha) EPG`) shrunk to a 2-core CPU: a ResNet of basic blocks [1, 1, 1] with
widths 8/16/32 (20k parameters), the first 6,000 training images of Debian's
`dataset-fashion-mnist` at 28 px (RandomCrop(28, padding 2) + flip), 4 epochs of batch 64
(lr / 10 after epoch 3), evaluated on all 10,000 test images after every epoch.

Arguments: alpha [0.2] (loss.alpha; 0 is EPG, 1 is CE), seed [0].

    for a in 0 0.2 1; do
      python -m aepg_jax.main --config=configs/scratch_default.py:alpha=$a \
        --workdir=runs/scratch_default/a$a
    done
    python scripts/compare_scratch.py runs/scratch_default/a* --out runs/scratch_default/alpha.png
"""

from aepg_jax.config import arguments
from aepg_jax.scratch import config as scratch_config


def get_config(arg=None):
    a = arguments.parse_arg(arg, alpha=0.2, seed=0)
    c = scratch_config.base_config("resnet_small")
    c.model.width = 8
    c.seed = a.seed
    c.data.source = "fashion_mnist"
    c.data.name = "fashion_mnist"
    c.data.image_size = 28
    c.data.pad = 2
    c.data.max_train_examples = 6_000
    c.loss.name = "mix"
    c.loss.alpha = a.alpha
    c.optim.batch_size = 64
    c.optim.epochs = 4
    c.optim.milestones = (3,)
    c.eval.batch_size = 1000
    c.log_every_steps = 20
    c.checkpoint_every_epochs = 1
    return c
