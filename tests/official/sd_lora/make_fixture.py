"""Generate tests/fixtures/official_sd_lora.npz: SD-LoRA's official code, end to end on tiny inputs.

Runs WuYichen-97/SD-Lora-CL (commit 8bacded, `models/sdlora.py` `Learner`, `utils/inc_net.py`
`IncrementalNet`, `backbone/lora.py` `LoRA_ViT_timm`, `backbone/linears.py` `SimpleLinear`)
unmodified, on:
  - the tiny timm ViT of tests/fixtures/timm_tiny_vit.safetensors (patch 8, 32 px, width 32,
    depth 2, 2 heads, MLP 128), returned by `timm.create_model` where the code asks for
    `vit_base_patch16_224` (pretrained, num_classes 0);
  - 3 tasks x 2 classes of 32 x 32 RGB uint8 images (numpy seed 0: a class colour plus noise),
    8 training and 4 test images per class, normalised to [-1, 1] (the project's
    `input.normalize=minus_one_one`), no augmentation;
  - LoRA rank 4 (the code's `r=10`, at width 32), SGD (momentum 0.9, no weight decay) with lr
    0.01, MultiStepLR milestones [10000] (constant, as exps/sdlora_inr.json), batch 8,
    3 epochs, each epoch's batch order given (stored), so the JAX side trains on the same
    sequence.
Stand-ins (scaffolding only): the data manager (given class order, no augmentation), the
DataLoader (yields the given order / the images in order), `.cuda()` as the identity (CPU),
`torch.load(weights_only=False)` (the code saves whole `nn.Linear` lists; torch >= 2.6 loads
tensors only by default), the LoRA-ViT's `out_dim` (the code writes ViT-B's 768) kept at 32.

Stored: the initial A (q and v per block) and head of every task, per step the loss and the
learning rate, after every task the trained A, B, the magnitudes (alpha of the task, alpha' of
the earlier ones), the head, the test logits and the accuracy matrix. Images, labels and orders
at the top.

Regenerate (needs the official code: `git clone https://github.com/WuYichen-97/SD-Lora-CL`):
    cp -a /work/venv_ease /work/venv_sdlora   # torch 2.13.0+cpu, numpy, safetensors, scipy
    /work/venv_sdlora/bin/pip install --no-deps timm==1.0.9 einops==0.8.0
    /work/venv_sdlora/bin/python tests/official/sd_lora/make_fixture.py --official=PATH
Generated with torch 2.13.0+cpu, timm 1.0.9 (the requirements.txt pin; torchvision stubbed:
benchmarks/_timm_import.py), einops 0.8.0, Python 3.11, numpy 2.4.6, on CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "official"))
import fixture_data  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "official_sd_lora.npz"
WEIGHTS = ROOT / "tests" / "fixtures" / "timm_tiny_vit.safetensors"

TASKS, PER_TASK, TRAIN_PER, TEST_PER = 3, 2, 8, 4
WIDTH, DEPTH, HEADS, PATCH, SIZE, RANK = 32, 2, 2, 8, 32, 4
EPOCHS, BATCH, LR = 3, 8, 0.01


def make_data():
    return fixture_data.make_data(TASKS, PER_TASK, SIZE, TRAIN_PER, TEST_PER, EPOCHS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--official", required=True, help="a checkout of WuYichen-97/SD-Lora-CL")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _timm_import

    timm = _timm_import.import_timm()
    sys.path.insert(0, args.official)
    import torch
    from safetensors.torch import load_file

    # CPU stand-ins: `.cuda()` is the identity; the saved nn.Linear lists load whole.
    torch.nn.Module.cuda = lambda self, *a, **k: self
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch_load = torch.load
    torch.load = lambda *a, **k: torch_load(*a, **{**k, "weights_only": False})

    def tiny_vit(name, pretrained=False, num_classes=0, **kw):
        assert name == "vit_base_patch16_224" and num_classes == 0, name
        from timm.models.vision_transformer import VisionTransformer

        model = VisionTransformer(
            img_size=SIZE, patch_size=PATCH, embed_dim=WIDTH, depth=DEPTH, num_heads=HEADS,
            mlp_ratio=4, qkv_bias=True, num_classes=0, global_pool="token",
        )  # fmt: skip
        state = {k: v for k, v in load_file(str(WEIGHTS)).items() if not k.startswith("head.")}
        model.load_state_dict(state)
        return model

    timm.create_model = tiny_vit
    from backbone import lora

    # The code sets `out_dim = 768` (ViT-B's) on the LoRA-ViT: this one keeps the tiny width.
    lora.LoRA_ViT_timm.out_dim = property(lambda self: WIDTH, lambda self, value: None)
    from models import sdlora as sdlora_mod

    xtr, ytr, xte, yte, orders = make_data()
    to_t = lambda u8: torch.tensor(u8.astype(np.float32) / 127.5 - 1.0).permute(0, 3, 1, 2)
    xtr_t, xte_t = to_t(xtr), to_t(xte)

    class Dataset:
        def __init__(self, idx, x, y, epoch_orders=None):
            self.idx, self.x, self.y = idx, x, y
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
            return Dataset(idx, x, y, epoch_orders)

    rec: dict[str, list] = {k: [] for k in ("loss", "lr")}

    class RecordingSGD(torch.optim.SGD):
        def step(self, *a, **k):
            rec["lr"].append(self.param_groups[0]["lr"])
            return super().step(*a, **k)

    cross_entropy = torch.nn.functional.cross_entropy

    def recording_ce(*a, **k):
        loss = cross_entropy(*a, **k)
        rec["loss"].append(float(loss.detach()))
        return loss

    sdlora_mod.DataLoader = Loader
    sdlora_mod.optim = types.SimpleNamespace(
        SGD=RecordingSGD, lr_scheduler=torch.optim.lr_scheduler
    )
    sdlora_mod.F = types.SimpleNamespace(cross_entropy=recording_ce)

    def lora_arrays(backbone, which):  # (2 targets [q, v], depth, ...) of w_As / w_Bs
        mods = backbone.w_As if which == "A" else backbone.w_Bs
        w = [m.weight.detach().numpy().copy() for m in mods]  # [q0, v0, q1, v1, ...]
        return np.stack([np.stack(w[0::2]), np.stack(w[1::2])])

    snap: dict[str, list] = {k: [] for k in ("init_A", "init_head_w", "A", "B", "alpha")}
    snap.update({"head_w": [], "head_b": [], "alpha_prev": [], "steps": []})

    def recorded(train_fn):
        def run(self, train_loader, test_loader, optimizer, scheduler):
            bb = self._network.backbone
            snap["init_A"].append(lora_arrays(bb, "A"))
            w = self._network.fc.weight.detach().numpy()
            snap["init_head_w"].append(w[self._known_classes :].copy())
            n0 = len(rec["loss"])
            train_fn(self, train_loader, test_loader, optimizer, scheduler)
            snap["steps"].append(len(rec["loss"]) - n0)
            snap["A"].append(lora_arrays(bb, "A"))
            snap["B"].append(lora_arrays(bb, "B"))
            snap["alpha"].append(float(bb.wrapped_param[0].param.detach()))
            prev = np.zeros(TASKS, np.float32)
            for i in range(self._cur_task):
                prev[i] = float(bb.wrapped_param_prev[i].param.detach())
            snap["alpha_prev"].append(prev)
            fc = self._network.fc
            snap["head_w"].append(fc.weight.detach().numpy().copy())
            snap["head_b"].append(fc.bias.detach().numpy().copy())

        return run

    sdlora_mod.Learner._init_train = recorded(sdlora_mod.Learner._init_train)
    sdlora_mod.Learner._update_representation = recorded(sdlora_mod.Learner._update_representation)

    work = tempfile.mkdtemp(prefix="sdlora_official_")
    cfg = {
        "memory_size": 0, "memory_per_class": 0, "fixed_memory": False, "shuffle": False,
        "init_cls": PER_TASK, "increment": PER_TASK, "model_name": "sdlora",
        "backbone_type": "vit_base_patch16_224", "device": [torch.device("cpu")],
        "seed": [0], "filepath": work + "/", "init_epoch": EPOCHS, "init_lr": LR,
        "init_milestones": [10000], "init_lr_decay": 0, "epochs": EPOCHS, "lrate": LR,
        "milestones": [10000], "lrate_decay": 0, "batch_size": BATCH, "optimizer": "sgd",
        "scheduler": "constant",
    }  # fmt: skip
    # The code's rank is fixed at 10 (`get_backbone`, `update_network`): rank RANK at width 32.
    lora_init = lora.LoRA_ViT_timm.__init__

    def rank_lora(self, vit_model, r, *a, **k):
        lora_init(self, vit_model, RANK, *a, **k)

    lora.LoRA_ViT_timm.__init__ = rank_lora
    torch.manual_seed(0)
    learner = sdlora_mod.Learner(cfg)
    dm = DataManager()
    c = TASKS * PER_TASK
    logits = np.full((TASKS, len(yte), c), np.nan, np.float32)
    acc = np.full((TASKS, TASKS), np.nan, np.float32)
    for t in range(TASKS):
        learner.incremental_train(dm)
        net = learner._network
        net.eval()
        with torch.no_grad():
            out_t = net(xte_t)["logits"].numpy()
        logits[t, :, : out_t.shape[1]] = out_t
        pred = out_t.argmax(1)
        for i in range(t + 1):
            sel = (yte >= i * PER_TASK) & (yte < (i + 1) * PER_TASK)
            acc[i, t] = 100.0 * np.mean(pred[sel] == yte[sel])
        learner.after_task()
    print("accuracy matrix (task i after task j):\n", acc)
    out = {"images_train": xtr, "labels_train": ytr, "images_test": xte, "labels_test": yte}
    out["orders"] = orders.astype(np.int32)
    out["loss"] = np.asarray(rec["loss"], np.float32)
    out["lr"] = np.asarray(rec["lr"], np.float32)
    out["steps"] = np.asarray(snap["steps"], np.int32)
    for k in ("init_A", "A", "B"):
        out[k] = np.stack(snap[k]).astype(np.float32)  # (T, 2, depth, ...)
    out["init_head_w"] = np.stack(snap["init_head_w"]).astype(np.float32)  # (T, n, D)
    out["alpha"] = np.asarray(snap["alpha"], np.float32)
    out["alpha_prev"] = np.stack(snap["alpha_prev"]).astype(np.float32)
    for k in ("head_w", "head_b"):
        full = np.zeros((TASKS, c, *snap[k][0].shape[1:]), np.float32)
        for t, w in enumerate(snap[k]):
            full[t, : w.shape[0]] = w
        out[k] = full
    out["logits"] = logits
    out["accuracy"] = acc
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
