"""Writes tests/fixtures/official_ranpac.npz: RanPAC's official code (RanPAC/RanPAC at commit
012927f86e8d95dc9e7c6015a5e1048e6604c8b6, `RanPAC.py` and `inc_net.py` imported unmodified)
run on a tiny stream, for tests/test_official_ranpac.py.

The stream: 3 tasks x 2 classes of 32x32 RGB images (numpy seed 0: a smooth random pattern
per class plus noise, 24 training and 8 test images per class, uint8), through the tiny timm
ViT of tests/fixtures/timm_tiny_vit.safetensors (patch 8, width 32, depth 2, 2 heads) as the
official learner's backbone, with the official settings of "RanPAC without PETL" (its
args ID 4: `model_name=ncm`, `use_RP=True`) and M = 128. Inputs are `(x / 255 - 0.5) / 0.5`,
the project's `input.normalize=minus_one_one`, with no crop (32 px stored, 32 px model).

Then the first-session adaptation of RanPAC's adapter variant (its args ID 7, `model_name=
adapter`) on the same stream's task 0 (`first_session`): the repository's AdaptFormer ViT
(`petl/vision_transformer_adapter.py`, imported unmodified) at the tiny sizes with the fixture's
weights, the adapters' dropout set to 0 (the project's ViT has none), SGD with the official
momentum, weight decay and cosine annealing at a larger lr (ADAPT_LR, ADAPT_EPOCHS), the task's
48 training images as one batch per epoch; the trainable parameters before and after are stored.

Stand-ins, scaffolding only: `.cuda()` / `.to(device='cuda')` stay on the CPU; `inc_net`'s
`get_convnet` returns the tiny timm ViT (the official one downloads ViT-B/16); the data manager
is a small object serving the stored images by class; `RanPAC.DataLoader` yields a given order
(the training images of the task in `order_t`, the fixture's numpy permutation, where the
official loader shuffles with torch's RNG; the test images in order); after the official
`setup_RP` draws `torch.randn(D, M)`, its matrix is replaced by the fixture's W (numpy seed 1,
N(0, 1)), which the JAX side is given too.

Regenerate (the official repository fetched to OFFICIAL, a torch venv)::

    python3 -m venv /work/venv_ranpac
    /work/venv_ranpac/bin/pip install torch==2.13.0
    /work/venv_ranpac/bin/pip install --no-deps timm==0.6.13
    /work/venv_ranpac/bin/pip install numpy safetensors tqdm pyyaml huggingface_hub
    /work/venv_ranpac/bin/python tests/official/ranpac/make_fixture.py --official=OFFICIAL

Generated with torch 2.13.0+cpu, timm 0.6.13, numpy 2.4.6 (CPU); easydict is replaced by a
two-line stand-in (the adapter ViT reads its config by attribute).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures"
TASKS, CLASSES_PER_TASK, TRAIN, TEST, M = 3, 2, 24, 8, 128
SIZE = 32
# The first-session adaptation: RanPAC's SGD settings (momentum 0.9, weight decay 5e-4, cosine
# to 0 per epoch) with a larger rate, so that the few steps move the adapters measurably.
ADAPT_EPOCHS, ADAPT_LR = 4, 2.0


def make_images(seed: int = 0):
    """`(train_x, train_y, test_x, test_y)`: uint8 NHWC images, labels 0..5 in class order."""
    rng = np.random.default_rng(seed)
    n_cls = TASKS * CLASSES_PER_TASK
    patterns = rng.uniform(90, 165, (n_cls, 4, 4, 3))
    patterns = patterns.repeat(SIZE // 4, 1).repeat(SIZE // 4, 2)

    def draw(n):
        x, y = [], []
        for c in range(n_cls):
            noise = rng.normal(0, 45, (n, SIZE, SIZE, 3))
            x.append(np.clip(patterns[c][None] + noise, 0, 255).round().astype(np.uint8))
            y.append(np.full(n, c, np.int32))
        return np.concatenate(x), np.concatenate(y)

    return (*draw(TRAIN), *draw(TEST))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--official", required=True, help="a checkout of RanPAC/RanPAC")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, args.official)
    import _timm_import

    timm = _timm_import.import_timm()
    import safetensors.torch
    import torch

    # -- CPU stand-ins for the official code's CUDA calls --------------------------------------
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    to = torch.Tensor.to

    def to_cpu(self, *a, **k):
        if k.get("device") == "cuda":
            k["device"] = "cpu"
        a = tuple("cpu" if x == "cuda" else x for x in a)
        return to(self, *a, **k)

    torch.Tensor.to = to_cpu

    import inc_net
    import RanPAC

    def tiny_vit(args, pretrained=False):
        model = timm.models.vision_transformer.VisionTransformer(
            img_size=SIZE,
            patch_size=8,
            embed_dim=32,
            depth=2,
            num_heads=2,
            mlp_ratio=4,
            num_classes=0,
        )
        state = safetensors.torch.load_file(str(FIXTURES / "timm_tiny_vit.safetensors"))
        model.load_state_dict({k: v for k, v in state.items() if not k.startswith("head.")})
        model.out_dim = 32
        return model.eval()

    inc_net.get_convnet = tiny_vit

    train_x, train_y, test_x, test_y = make_images()
    rng = np.random.default_rng(1)
    w_rand = rng.standard_normal((32, M)).astype(np.float32)
    orders = [rng.permutation(TRAIN * CLASSES_PER_TASK) for _ in range(TASKS)]

    def to_tensor(x):
        return torch.from_numpy(((x.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(0, 3, 1, 2))

    class Dataset:
        def __init__(self, x, y, order):
            self.x, self.y, self.order = to_tensor(x), torch.from_numpy(y).long(), order
            self.labels = y

    class DataManager:
        nb_tasks = TASKS

        def get_total_classnum(self):
            return TASKS * CLASSES_PER_TASK

        def get_task_size(self, task):
            return CLASSES_PER_TASK

        def get_dataset(self, classes, source, mode):
            x, y = (train_x, train_y) if source == "train" else (test_x, test_y)
            keep = np.isin(y, classes)
            order = None
            if source == "train" and mode == "test":  # the loader for the class prototypes
                order = orders[int(classes[0]) // CLASSES_PER_TASK]
            return Dataset(x[keep], y[keep], order)

    def loader(dataset, batch_size, shuffle, num_workers):
        idx = np.arange(len(dataset.y)) if dataset.order is None else dataset.order
        return [
            (None, dataset.x[idx[i : i + batch_size]], dataset.y[idx[i : i + batch_size]])
            for i in range(0, len(idx), batch_size)
        ]

    RanPAC.DataLoader = loader
    setup_rp = RanPAC.Learner.setup_RP

    def setup_rp_with_fixture_matrix(self):
        setup_rp(self)  # draws torch.randn(D, M); the fixture's W replaces it
        self._network.fc.W_rand = torch.from_numpy(w_rand)
        self.W_rand = torch.from_numpy(w_rand)

    RanPAC.Learner.setup_RP = setup_rp_with_fixture_matrix
    ridges = []
    optimise = RanPAC.Learner.optimise_ridge_parameter

    def record_ridge(self, features, y):
        ridges.append(optimise(self, features, y))
        return ridges[-1]

    RanPAC.Learner.optimise_ridge_parameter = record_ridge

    torch.manual_seed(1)  # trainer.py's _set_random
    learner = RanPAC.Learner(
        {
            "model_name": "ncm",
            "convnet_type": "pretrained_vit_b16_224",
            "device": ["cpu"],
            "batch_size": 16,
            "use_RP": True,
            "M": M,
            "weight_decay": 0.0005,
            "min_lr": 0.0,
            "tuned_epoch": 0,
            "body_lr": 0.0,
            "head_lr": 0.0,
        }
    )
    learner.is_dil, learner.dil_init = False, False
    data = DataManager()
    out = {
        "train_x": train_x,
        "train_y": train_y,
        "test_x": test_x,
        "test_y": test_y,
        "w_rand": w_rand,
        "orders": np.stack(orders),
        "m": np.int32(M),
    }
    acc = np.full((TASKS, TASKS), np.nan)
    for t in range(TASKS):
        learner.incremental_train(data)
        y_pred, y_true = learner._eval_cnn(learner.test_loader)
        with torch.no_grad():
            logits = torch.cat([learner._network(x)["logits"] for _, x, _ in learner.test_loader])
        for s in range(t + 1):
            keep = (y_true >= s * CLASSES_PER_TASK) & (y_true < (s + 1) * CLASSES_PER_TASK)
            acc[t, s] = 100.0 * np.mean(y_pred[keep, 0] == y_true[keep])
        out[f"gram_{t}"] = learner.G.numpy()
        out[f"q_{t}"] = learner.Q.numpy()
        out[f"readout_{t}"] = learner._network.fc.weight.detach().numpy()
        out[f"logits_{t}"] = logits.numpy()
        out[f"pred_{t}"] = y_pred[:, 0]
        learner.after_task()
    out["ridges"] = np.asarray(ridges)
    out["accuracy"] = acc
    out.update(first_session(timm, torch, RanPAC, inc_net, data, args.official))
    np.savez_compressed(FIXTURES / "official_ranpac.npz", **out)
    print("ridges", ridges, "accuracy", acc, sep="\n")


def first_session(timm, torch, ranpac_module, inc_net, data, official: str) -> dict:
    """RanPAC's adapter variant (its args ID 7 `model_name=adapter`) on task 0 of the same
    stream: the official `_init_train` (SGD over `self._network.parameters()`, momentum 0.9,
    `CosineAnnealingLR(T_max=tuned_epoch, eta_min=min_lr)`, RanPAC.py L237-243) on the
    repository's AdaptFormer ViT (petl/vision_transformer_adapter.py, `ffn_num` 64 as inc_net.py
    L117 hard-codes, scale 0.1, "lora" init) at the tiny sizes, the task's 48 training images as
    one batch per epoch (ADAPT_EPOCHS steps). Returns the trainable parameters before (`adapt/
    init/<name>`) and after (`adapt/adapted/<name>`) the adaptation."""
    sys.path.insert(0, official)
    from petl import vision_transformer_adapter as vta

    class EasyDict(dict):  # easydict's attribute access, the only part the ViT reads
        __getattr__ = dict.__getitem__

    state = safetensors_state(torch)

    def adapter_vit(args, pretrained=False):
        # inc_net.py L117-131's tuning_config at width 32
        tuning_config = EasyDict(
            ffn_adapt=True, ffn_option="parallel", ffn_adapter_layernorm_option="none",
            ffn_adapter_init_option="lora", ffn_adapter_scalar="0.1", ffn_num=64,
            d_model=32, vpt_on=False, vpt_num=0,
        )  # fmt: skip
        model = vta.VisionTransformer(
            img_size=SIZE, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=4,
            qkv_bias=True, num_classes=0, global_pool=False, drop_path_rate=0.0,
            tuning_config=tuning_config,
        )  # fmt: skip
        # vision_transformer_adapter.py L423-458: qkv split (at width 32), `mlp.fc*` renamed,
        # everything but the adapters frozen.
        sd = dict(state)
        for key in list(sd):
            for kind in ("weight", "bias"):
                if f"qkv.{kind}" in key:
                    for name, value in zip("qkv", sd.pop(key).split(32), strict=True):
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
                module.dropout = 0.0  # the adapters' dropout 0.1 off: the project has none
        model.out_dim = 32
        return model.eval()

    inc_net.get_convnet = adapter_vit
    torch.manual_seed(2)
    learner = ranpac_module.Learner(
        {
            "model_name": "adapter",
            "convnet_type": "pretrained_vit_b16_224_adapter",
            "device": ["cpu"],
            "batch_size": TRAIN * CLASSES_PER_TASK,  # one batch: the loader's shuffle is moot
            "use_RP": True,
            "M": M,
            "weight_decay": 0.0005,
            "min_lr": 0.0,
            "tuned_epoch": ADAPT_EPOCHS,
            "body_lr": ADAPT_LR,
            "head_lr": ADAPT_LR,
        }
    )
    learner.is_dil, learner.dil_init = False, False
    out = {}
    init_train = learner._init_train

    def recorded(*a):
        def snap():
            return {
                k: v.detach().clone().numpy()
                for k, v in learner._network.named_parameters()
                if v.requires_grad
            }

        before = snap()
        init_train(*a)
        for k, v in snap().items():
            out[f"adapt/init/{k}"], out[f"adapt/adapted/{k}"] = before[k], v

    learner._init_train = recorded
    learner.incremental_train(data)
    assert out, "the official learner did not adapt"
    out["adapt/lr"], out["adapt/epochs"] = np.float32(ADAPT_LR), np.int32(ADAPT_EPOCHS)
    return out


def safetensors_state(torch) -> dict:
    import safetensors.torch

    state = safetensors.torch.load_file(str(FIXTURES / "timm_tiny_vit.safetensors"))
    return {k: v for k, v in state.items() if not k.startswith("head.")}


if __name__ == "__main__":
    main()
