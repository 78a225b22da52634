"""Write tests/fixtures/official_aper.npz: SimpleCIL and APER (adapter) run by their official code.

zhoudw-zdw/RevisitingCIL at commit a2e6b71f6a2fed4421609a0917eea861fa387c76: its
`models/simplecil.py` and `models/aper_adapter.py` Learners, `utils/inc_net.py` networks,
`convs/linears.py` CosineLinear and `convs/vision_transformer_adapter.py` ViT and Adapter are
imported unmodified and driven task by task as its `trainer.py` does (`incremental_train`,
`eval_task`, `after_task`), on the tiny timm ViT of tests/fixtures/timm_tiny_vit.safetensors
(patch 8, 32 px, width 32, depth 2, 2 heads) and tiny random images stored in the fixture.

Stand-ins, scaffolding only:
  * `utils.inc_net.get_convnet` builds the tiny models instead of timm's ViT-B/16 downloads: the
    pretrained branch is timm's `VisionTransformer(num_classes=0)` with the fixture's weights;
    the adapter branch is the repository's own `vision_transformer_adapter.VisionTransformer`
    at the tiny sizes with its own AdaptFormer `tuning_config` (`ffn_num` = FFN_NUM), loaded as
    its `vit_base_patch16_224_in21k_adapter` loads (qkv split into q/k/v, `mlp.fc*` renamed,
    everything but the adapters frozen), the split at the tiny width instead of the hard-coded 768;
  * a data manager yielding the fixture's images (float in [0, 1], as the code's `ToTensor` with
    no normalisation) with the code's `get_dataset(indices, source, mode)` interface; the
    training "augmentation" is the test transform (the comparison runs without augmentation)
    and each task's training set is one batch (`batch_size` >= its size), so the DataLoader's
    shuffle does not change a step;
  * `num_workers = 0`; `.cuda()` is the identity (CPU); `topk = 1` (the tasks have 2 classes);
  * the adapters' dropout (0.1 in `Block.__init__`) set to 0 after construction: this project's
    ViT has no dropout (docs/algorithm.md §20 lists it among the departures).

Regenerate (torch and timm 0.6.13 in a venv of their own: the code's README names 0.6.12, whose
`maxxvit` dataclasses do not import on Python 3.11; 0.6.13 is its fix release, the ViT unchanged):

    python3 -m venv /tmp/venv_rcil
    /tmp/venv_rcil/bin/pip install torch==2.13.0
    /tmp/venv_rcil/bin/pip install --no-deps timm==0.6.13
    /tmp/venv_rcil/bin/pip install easydict scipy tqdm safetensors numpy pyyaml huggingface_hub
    git clone https://github.com/zhoudw-zdw/RevisitingCIL /tmp/rcil  # at the commit above
    /tmp/venv_rcil/bin/python tests/official/aper/make_fixture.py --repo=/tmp/rcil

Generated with torch 2.13.0+cpu, timm 0.6.13, numpy (the fixture's `versions`), Python 3.11, CPU.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
import _timm_import  # noqa: E402  (torchvision stubbed before timm imports it)

COMMIT = "a2e6b71f6a2fed4421609a0917eea861fa387c76"
WEIGHTS = ROOT / "tests" / "fixtures" / "timm_tiny_vit.safetensors"
OUT = ROOT / "tests" / "fixtures" / "official_aper.npz"
IMAGE, PATCH, WIDTH, DEPTH, HEADS = 32, 8, 32, 2, 2
TASKS, PER_TASK, TRAIN_PER_CLASS, TEST_PER_CLASS = 3, 2, 12, 8
FFN_NUM = 8
# APER's settings at the tiny size: its configs' optimiser (SGD, momentum 0.9, weight decay
# 5e-4, CosineAnnealingLR to 0 per epoch), a larger rate so the few steps move the adapters.
ARGS = {
    "init_cls": PER_TASK,
    "increment": PER_TASK,
    "weight_decay": 0.0005,
    "min_lr": 0,
    "optimizer": "sgd",
    "tuned_epoch": 3,
    "init_lr": 2.0,
    "batch_size": TRAIN_PER_CLASS * PER_TASK,
    "ffn_num": FFN_NUM,
    "memory_size": 0,
    "device": ["cpu"],
    "seed": [1993],
}


def make_images(seed: int = 0) -> dict[str, np.ndarray]:
    """Per class a smooth random pattern, each image that pattern plus noise, uint8 NHWC."""
    rng = np.random.default_rng(seed)
    classes = TASKS * PER_TASK
    coarse = rng.uniform(0, 255, (classes, 4, 4, 3))
    patterns = np.repeat(np.repeat(coarse, IMAGE // 4, 1), IMAGE // 4, 2)
    out = {}
    for split, n in (("train", TRAIN_PER_CLASS), ("test", TEST_PER_CLASS)):
        labels = np.repeat(np.arange(classes), n)
        noise = rng.normal(0, 60, (len(labels), IMAGE, IMAGE, 3))
        images = np.clip(0.5 * patterns[labels] + 0.5 * 128 + noise, 0, 255).astype(np.uint8)
        out[f"{split}_images"], out[f"{split}_labels"] = images, labels.astype(np.int64)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True, help="RevisitingCIL checkout at COMMIT")
    args = parser.parse_args()
    sys.path.insert(0, args.repo)
    timm = _timm_import.import_timm()
    import safetensors.torch
    import torch
    from easydict import EasyDict
    from torch import nn

    torch.Tensor.cuda = lambda self, *a, **k: self  # CPU
    nn.Module.cuda = lambda self, *a, **k: self

    import models.aper_adapter as aper_adapter
    import models.simplecil as simplecil
    import utils.inc_net as inc_net
    from convs import vision_transformer_adapter as vta

    state = {k: v for k, v in safetensors.torch.load_file(WEIGHTS).items() if "head" not in k}

    def pretrained() -> nn.Module:
        model = timm.models.vision_transformer.VisionTransformer(
            img_size=IMAGE, patch_size=PATCH, embed_dim=WIDTH, depth=DEPTH, num_heads=HEADS,
            num_classes=0,
        )  # fmt: skip
        model.load_state_dict(state)
        model.out_dim = WIDTH
        return model.eval()

    def adapter_model(ffn_num: int) -> nn.Module:
        # The official `get_convnet` tuning_config (utils/inc_net.py lines 99-111) at width 32.
        tuning_config = EasyDict(
            ffn_adapt=True, ffn_option="parallel", ffn_adapter_layernorm_option="none",
            ffn_adapter_init_option="lora", ffn_adapter_scalar="0.1", ffn_num=ffn_num,
            d_model=WIDTH, vpt_on=False, vpt_num=0,
        )  # fmt: skip
        model = vta.VisionTransformer(
            img_size=IMAGE, patch_size=PATCH, embed_dim=WIDTH, depth=DEPTH, num_heads=HEADS,
            mlp_ratio=4, qkv_bias=True, num_classes=0, global_pool=False, drop_path_rate=0.0,
            tuning_config=tuning_config,
        )  # fmt: skip
        # vision_transformer_adapter.py lines 420-466, the qkv split at WIDTH instead of 768.
        sd = dict(state)
        for key in list(sd):
            for kind in ("weight", "bias"):
                if f"qkv.{kind}" in key:
                    q, k, v = sd.pop(key).split(WIDTH)
                    for name, value in (("q", q), ("k", k), ("v", v)):
                        sd[key.replace(f"qkv.{kind}", f"{name}_proj.{kind}")] = value
        for key in list(sd):
            if "mlp.fc" in key:
                sd[key.replace("mlp.", "")] = sd.pop(key)
        msg = model.load_state_dict(sd, strict=False)
        assert not msg.unexpected_keys, msg.unexpected_keys
        for name, p in model.named_parameters():
            p.requires_grad = name in msg.missing_keys
        for module in model.modules():
            if isinstance(module, vta.Adapter):
                module.dropout = 0.0  # this project's ViT has no dropout
        model.out_dim = WIDTH
        return model.eval()

    def get_convnet(cargs, pretrained_flag=False):
        name = cargs["convnet_type"]
        return adapter_model(cargs["ffn_num"]) if name.endswith("_adapter") else pretrained()

    inc_net.get_convnet = get_convnet
    simplecil.num_workers = aper_adapter.num_workers = 0
    data = make_images()

    class Subset(torch.utils.data.Dataset):
        def __init__(self, images, labels):
            self.images = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
            self.labels = labels

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, i):
            return i, self.images[i], int(self.labels[i])

    class DataManager:
        nb_tasks = TASKS

        def get_task_size(self, task):
            return PER_TASK

        def get_dataset(self, indices, source, mode):
            keep = np.isin(data[f"{source}_labels"], indices)
            return Subset(data[f"{source}_images"][keep], data[f"{source}_labels"][keep])

    out: dict[str, np.ndarray] = {**data}
    for method, module, convnet in (
        ("simplecil", simplecil, "pretrained_vit_b16_224_in21k"),
        ("aper", aper_adapter, "pretrained_vit_b16_224_in21k_adapter"),
    ):
        torch.manual_seed(1993)
        margs = {**copy.deepcopy(ARGS), "model_name": f"{method}_adapter" if method == "aper"
                 else method, "convnet_type": convnet}  # fmt: skip
        learner = module.Learner(margs)
        learner.topk = 1
        if method == "aper":
            init_train = learner._init_train

            def recorded(*a, learner=learner, init_train=init_train):
                snap = lambda: {
                    k: v.detach().clone().numpy()
                    for k, v in learner._network.named_parameters()
                    if v.requires_grad
                }
                before = snap()
                init_train(*a)
                after = snap()
                for k in before:
                    out[f"aper/init/{k}"], out[f"aper/adapted/{k}"] = before[k], after[k]

            learner._init_train = recorded
        dm, matrix = DataManager(), np.zeros((TASKS, TASKS))
        for t in range(TASKS):
            learner.incremental_train(dm)
            y_pred, y_true = learner._eval_cnn(learner.test_loader)
            pred = y_pred[:, 0]
            out[f"{method}/pred_{t}"] = pred
            out[f"{method}/prototypes_{t}"] = learner._network.fc.weight.detach().numpy().copy()
            for i in range(t + 1):
                own = (y_true >= i * PER_TASK) & (y_true < (i + 1) * PER_TASK)
                matrix[i, t] = 100.0 * np.mean(pred[own] == y_true[own])
            learner.after_task()
        out[f"{method}/accuracy_matrix"] = matrix
        print(method, "\n", np.round(matrix, 2))
    out["versions"] = np.asarray([f"torch {torch.__version__}", f"timm {timm.__version__}",
                                  f"numpy {np.__version__}", f"commit {COMMIT}"])  # fmt: skip
    np.savez_compressed(OUT, **out)
    print("wrote", OUT, sorted(k for k in out if k.startswith("aper/init")))


if __name__ == "__main__":
    main()
