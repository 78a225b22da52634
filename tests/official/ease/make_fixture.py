"""Generate tests/fixtures/official_ease.npz: EASE's official code, run end to end on tiny inputs.

Runs sun-hailong/CVPR24-Ease (commit 6d67508, `models/ease.py` `Learner`, `utils/inc_net.py`
`EaseNet`, `backbone/vit_ease.py`, `backbone/linears.py` `CosineLinear`) unmodified, on:
  - the tiny timm ViT of tests/fixtures/timm_tiny_vit.safetensors (patch 8, 32 px, width 32,
    depth 2, 2 heads, MLP 128) built as `vit_ease.VisionTransformer` with those dims and loaded
    with the official key conversion (`vit_base_patch16_224_ease`'s q/k/v split, at width 32);
  - 3 tasks x 2 classes of 32 x 32 RGB uint8 images (numpy seed 0: a class colour plus noise),
    8 training and 4 test images per class, normalised to [-1, 1] (the project's
    `input.normalize=minus_one_one`), no augmentation;
  - adapters of width `ffn_num` 4, Adam (weight decay 0, constant lr 0.01), batch 8, 3 epochs,
    each epoch's batch order given (stored), so the JAX side trains on the same sequence.
Stand-ins (scaffolding only): the data manager (given class order, no augmentation), the
DataLoader (yields the given order / the images in order), `get_backbone`'s timm download (the
tiny model instead), the adapters' dropout set to 0 (the project's adapter has none). Three
configurations: `a` (use_init_ptm False, alpha 0.1, reweight: the default json), `b`
(use_init_ptm True, alpha 0.005, beta 1: ease_cub.json), `c` (use_reweight False).

Stored per configuration `<cfg>/...`: the initial adapter and proxy head of every task, the
trained adapter and sigma, the prototypes (`fc.weight`) after every task, the test logits and
predictions after every task, the accuracy matrix. Images, labels and orders at the top.

Regenerate (needs the official code: `git clone https://github.com/sun-hailong/CVPR24-Ease`):
    python3 -m venv /work/venv_ease
    /work/venv_ease/bin/pip install torch==2.13.0 numpy safetensors easydict scipy tqdm pillow
    /work/venv_ease/bin/pip install --no-deps timm==0.6.13  # 0.6.12 fails to import on 3.11
    /work/venv_ease/bin/python tests/official/ease/make_fixture.py --official=PATH/TO/CVPR24-Ease
Generated with torch 2.13.0+cpu, timm 0.6.13 (the README names 0.6.12, whose maxxvit module
does not import on Python 3.11; the code uses only its ViT pieces; torchvision stubbed:
benchmarks/_timm_import.py), Python 3.11,
numpy 2.4.6, on CPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "official"))
import fixture_data  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "official_ease.npz"
WEIGHTS = ROOT / "tests" / "fixtures" / "timm_tiny_vit.safetensors"

TASKS, PER_TASK, TRAIN_PER, TEST_PER = 3, 2, 8, 4
WIDTH, DEPTH, HEADS, PATCH, SIZE, FFN = 32, 2, 2, 8, 32, 4
EPOCHS, BATCH, LR = 3, 8, 0.01
CONFIGS = {
    "a": {"use_init_ptm": False, "alpha": 0.1, "beta": 0.0, "use_reweight": True},
    "b": {"use_init_ptm": True, "alpha": 0.005, "beta": 1.0, "use_reweight": True},
    "c": {"use_init_ptm": False, "alpha": 0.1, "beta": 0.0, "use_reweight": False},
}


def make_data():
    return fixture_data.make_data(TASKS, PER_TASK, SIZE, TRAIN_PER, TEST_PER, EPOCHS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--official", required=True, help="a checkout of sun-hailong/CVPR24-Ease")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _timm_import

    _timm_import.import_timm()
    sys.path.insert(0, args.official)
    import torch
    from backbone import vit_ease
    from models import ease as ease_mod
    from safetensors.torch import load_file

    xtr, ytr, xte, yte, orders = make_data()
    to_t = lambda u8: torch.tensor(u8.astype(np.float32) / 127.5 - 1.0).permute(0, 3, 1, 2)
    xtr_t, xte_t = to_t(xtr), to_t(xte)

    def tiny_backbone(num_classes=0, global_pool=False, drop_path_rate=0.0, tuning_config=None):
        from functools import partial

        tuning_config.d_model = WIDTH  # get_backbone writes ViT-B's 768

        class Tiny(vit_ease.VisionTransformer):
            # get_backbone then sets out_dim = 768 (ViT-B's): this one keeps the tiny width.
            out_dim = property(lambda self: WIDTH, lambda self, value: None)

        model = Tiny(
            img_size=SIZE, patch_size=PATCH, embed_dim=WIDTH, depth=DEPTH, num_heads=HEADS,
            mlp_ratio=4, qkv_bias=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
            num_classes=num_classes, global_pool=global_pool, drop_path_rate=drop_path_rate,
            tuning_config=tuning_config,
        )  # fmt: skip
        state = load_file(str(WEIGHTS))
        for key in list(state):  # vit_base_patch16_224_ease's conversion, at width WIDTH
            if "qkv." in key:
                w = state.pop(key)
                for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
                    state[key.replace("qkv", name)] = w[i * WIDTH : (i + 1) * WIDTH]
        for key in list(state):
            if "mlp.fc" in key:
                state[key.replace("mlp.", "")] = state.pop(key)
        state = {k: v for k, v in state.items() if not k.startswith("head.")}
        msg = model.load_state_dict(state, strict=False)
        assert all("adapter" in k for k in msg.missing_keys), msg
        assert not msg.unexpected_keys, msg
        for name, p in model.named_parameters():
            p.requires_grad = name in msg.missing_keys
        return model

    vit_ease.vit_base_patch16_224_ease = tiny_backbone
    from backbone import linears

    forward_reweight = linears.CosineLinear.forward_reweight

    def tiny_forward_reweight(self, *a, **k):  # its `out_dim` defaults to ViT-B's 768
        return forward_reweight(self, *a, **{**k, "out_dim": WIDTH})

    linears.CosineLinear.forward_reweight = tiny_forward_reweight

    get_new_adapter = vit_ease.VisionTransformer.get_new_adapter

    def no_dropout_adapter(self):
        get_new_adapter(self)
        for a in self.cur_adapter:
            a.dropout = 0.0  # the project's adapter has no dropout

    vit_ease.VisionTransformer.get_new_adapter = no_dropout_adapter

    class Dataset:
        def __init__(self, idx, x, y, mode, epoch_orders=None):
            self.idx, self.x, self.y, self.mode = idx, x, y, mode
            self.labels = y[idx]
            self.epoch_orders, self.epoch = epoch_orders, 0

    class Loader:  # the DataLoader stand-in: the given order, else the images in order
        def __init__(self, dataset, batch_size, shuffle=False, num_workers=0):
            self.ds, self.bs = dataset, batch_size

        def __len__(self):
            return -(-len(self.ds.idx) // self.bs)

        def __iter__(self):
            ds = self.ds
            order = ds.idx
            if ds.epoch_orders is not None:
                order = ds.epoch_orders[ds.epoch]
                ds.epoch += 1
            for s in range(0, len(order), self.bs):
                b = order[s : s + self.bs]
                yield torch.as_tensor(b), ds.x[b], torch.as_tensor(ds.y[b]).long()

    class DataManager:
        def get_task_size(self, task):
            return PER_TASK

        def get_dataset(self, classes, source, mode):
            x, y = (xtr_t, ytr) if source == "train" else (xte_t, yte)
            idx = np.nonzero(np.isin(y, classes))[0]
            epoch_orders = None
            if source == "train" and mode == "train":
                epoch_orders = orders[int(classes[0]) // PER_TASK]
            return Dataset(idx, x, y, mode, epoch_orders)

    ease_mod.DataLoader = Loader
    out = {"images_train": xtr, "labels_train": ytr, "images_test": xte, "labels_test": yte}
    out["orders"] = orders.astype(np.int32)
    cfg_common = {
        "memory_size": 0, "memory_per_class": 0, "fixed_memory": False, "init_cls": PER_TASK,
        "increment": PER_TASK, "model_name": "ease", "backbone_type": "vit_base_patch16_224_ease",
        "device": [torch.device("cpu")], "init_epochs": EPOCHS, "init_lr": LR,
        "later_epochs": EPOCHS, "later_lr": LR, "batch_size": BATCH, "weight_decay": 0.0,
        "min_lr": 0, "optimizer": "adam", "scheduler": "constant", "ffn_num": FFN,
        "use_diagonal": False, "recalc_sim": True, "use_old_data": False, "moni_adam": False,
        "adapter_num": -1,
    }  # fmt: skip
    for name, extra in CONFIGS.items():
        torch.manual_seed(0)
        learner = ease_mod.Learner({**cfg_common, **extra})
        net = learner._network
        init_train = ease_mod.Learner._init_train
        rec: dict[str, list] = {k: [] for k in ("init_adapter", "init_head", "adapter", "sigma")}

        def adapter_arrays(mods):
            return {
                f"{layer}_{leaf}": np.stack(
                    [getattr(getattr(m, f"{layer}_proj"), leaf).detach().numpy() for m in mods]
                )
                for layer in ("down", "up")
                for leaf in ("weight", "bias")
            }

        def recording_init_train(self, *a, rec=rec, init_train=init_train):
            rec["init_adapter"].append(adapter_arrays(self._network.backbone.cur_adapter))
            rec["init_head"].append(self._network.proxy_fc.weight.detach().numpy().copy())
            init_train(self, *a)
            rec["adapter"].append(adapter_arrays(self._network.backbone.cur_adapter))
            rec["sigma"].append(float(self._network.proxy_fc.sigma.detach()))

        ease_mod.Learner._init_train = recording_init_train
        dm = DataManager()
        c = TASKS * PER_TASK
        protos = np.zeros((TASKS, c, TASKS + 1, WIDTH), np.float32)
        logits = np.full((TASKS, len(yte), c), np.nan, np.float32)
        acc = np.full((TASKS, TASKS), np.nan, np.float32)
        for t in range(TASKS):
            learner.incremental_train(dm)
            w = net.fc.weight.detach().numpy()
            protos[t, : w.shape[0], : w.shape[1] // WIDTH] = w.reshape(w.shape[0], -1, WIDTH)
            net.eval()
            with torch.no_grad():
                out_t = net(xte_t, test=True)["logits"].numpy()
            logits[t, :, : out_t.shape[1]] = out_t
            pred = out_t.argmax(1)
            for i in range(t + 1):
                sel = (yte >= i * PER_TASK) & (yte < (i + 1) * PER_TASK)
                acc[i, t] = 100.0 * np.mean(pred[sel] == yte[sel])
            learner.after_task()
        ease_mod.Learner._init_train = init_train
        for key in ("init_adapter", "adapter"):
            for leaf in rec[key][0]:
                out[f"{name}/{key}/{leaf}"] = np.stack([r[leaf] for r in rec[key]])
        out[f"{name}/init_head"] = np.stack(rec["init_head"])
        out[f"{name}/sigma"] = np.asarray(rec["sigma"], np.float32)
        out[f"{name}/prototypes"] = protos
        out[f"{name}/logits"] = logits
        out[f"{name}/accuracy"] = acc
        print(name, "accuracy matrix (task i after task j):\n", acc)
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
