"""Generate tests/fixtures/official_slca.npz: SLCA's official code, run end to end on tiny inputs.

Runs GengDavid/SLCA (commit 169d4e6, `models/slca.py` `SLCA`, `models/base.py`
`_compute_class_mean`, `utils/inc_net.py` `FinetuneIncrementalNet`, `convs/linears.py`
`SimpleContinualLinear`, `convs/vits.py` `VisionTransformer`) unmodified, on:
  - the tiny timm ViT of tests/fixtures/timm_tiny_vit.safetensors (patch 8, 32 px, width 32,
    depth 2, 2 heads, MLP 128) built as `convs.vits.VisionTransformer` with those dims, then as
    `vit_base_patch16_224_in21k` does: its head and final norm deleted, a fresh
    `nn.LayerNorm(32)` as the final norm;
  - 3 tasks x 2 classes of 32 x 32 RGB uint8 images (numpy seed 0: a class colour plus noise),
    6 training and 3 test images per class, in [0, 1] (ToTensor, the project's
    `input.normalize=none`), no augmentation; each task's training set is one batch (12), so
    the batch order cannot differ;
  - SGD (momentum 0.9, weight decay 5e-4), head lr 0.05, backbone lr 0.05 x 0.1 (`bcb_lrscale`),
    3 epochs, MultiStepLR milestones [2] (gamma 0.1); classifier alignment 2 epochs, 256
    samples per class (the code's constant), logit normalisation 0.1.
Stand-ins (scaffolding only): the data manager (the images in order), the DataLoader (yields the
dataset in order), `get_convnet` (the tiny model instead of the download), `save_checkpoint`
(nothing written), torchvision and scipy stubbed (unused by this path).

Stored: images, labels; per task t: the new head's initial weight and bias, every step's loss
and the two parameter groups' lrs (stage 1) and the alignment's losses, the class means and
covariances, the backbone (timm names) after tasks 0 and 2, the classifier before and after
alignment, the alignment's shuffled samples and targets per epoch, the test logits; the
accuracy matrix.

Regenerate (needs the official code: `git clone https://github.com/GengDavid/SLCA`):
    python3 -m venv /work/venv_slca
    /work/venv_slca/bin/pip install torch==2.13.0 numpy safetensors
    /work/venv_slca/bin/pip install --no-deps timm==0.6.13
    /work/venv_slca/bin/python tests/official/slca/make_fixture.py --official=PATH/TO/SLCA
Generated with torch 2.13.0+cpu, timm 0.6.13, Python 3.11, numpy 2.4.6, on CPU.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "fixtures" / "official_slca.npz"
WEIGHTS = ROOT / "tests" / "fixtures" / "timm_tiny_vit.safetensors"

TASKS, PER_TASK, TRAIN_PER, TEST_PER = 3, 2, 6, 3
WIDTH, DEPTH, HEADS, PATCH, SIZE = 32, 2, 2, 8, 32
EPOCHS, MILESTONES, LR, BCB_SCALE, CA_EPOCHS, LOGIT_NORM = 3, [2], 0.05, 0.1, 2, 0.1
KEEP_PARAMS = (0, 2)  # the tasks after which the backbone is stored


def make_data():
    rng = np.random.default_rng(0)
    classes = TASKS * PER_TASK
    colours = rng.integers(40, 216, (classes, 3))

    def images(n):
        x, y = [], []
        for c in range(classes):
            noise = rng.normal(0, 40, (n, SIZE, SIZE, 3))
            x.append(np.clip(colours[c] + noise, 0, 255).astype(np.uint8))
            y += [c] * n
        return np.concatenate(x), np.asarray(y, np.int32)

    xtr, ytr = images(TRAIN_PER)
    xte, yte = images(TEST_PER)
    return xtr, ytr, xte, yte


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--official", required=True, help="a checkout of GengDavid/SLCA")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _timm_import

    _timm_import.import_timm()
    scipy = types.ModuleType("scipy")  # models/base.py imports cdist (NME eval, unused here)
    scipy.spatial = types.ModuleType("scipy.spatial")
    scipy.spatial.distance = types.ModuleType("scipy.spatial.distance")
    scipy.spatial.distance.cdist = None
    sys.modules.update(
        {"scipy": scipy, "scipy.spatial": scipy.spatial,
         "scipy.spatial.distance": scipy.spatial.distance}
    )  # fmt: skip
    sys.path.insert(0, args.official)
    from functools import partial

    import torch
    from convs import vits
    from models import slca as slca_mod
    from safetensors.torch import load_file
    from utils import inc_net

    torch.set_num_threads(1)
    xtr, ytr, xte, yte = make_data()
    to_t = lambda u8: torch.tensor(u8.astype(np.float32) / 255.0).permute(0, 3, 1, 2)
    xtr_t, xte_t = to_t(xtr), to_t(xte)

    def tiny_convnet(cfg, pretrained=False):  # vit_base_patch16_224_in21k at the tiny dims
        model = vits.VisionTransformer(
            img_size=SIZE, patch_size=PATCH, embed_dim=WIDTH, depth=DEPTH, num_heads=HEADS,
            mlp_ratio=4, qkv_bias=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
            num_classes=10,
        )  # fmt: skip
        msg = model.load_state_dict(load_file(str(WEIGHTS)), strict=True)
        assert not msg.missing_keys and not msg.unexpected_keys, msg
        del model.head
        del model.norm
        model.norm = torch.nn.LayerNorm(WIDTH)  # as vit_base_patch16_224_in21k (eps 1e-5)
        return model

    inc_net.get_convnet = tiny_convnet

    class Dataset:
        def __init__(self, idx, x, y):
            self.idx, self.x, self.y = idx, x, y

        def __len__(self):
            return len(self.idx)

    class Loader:  # the DataLoader stand-in: the dataset in order
        def __init__(self, dataset, batch_size, shuffle=False, num_workers=0):
            self.ds, self.bs = dataset, batch_size

        def __len__(self):
            return -(-len(self.ds.idx) // self.bs)

        def __iter__(self):
            ds = self.ds
            for s in range(0, len(ds.idx), self.bs):
                b = ds.idx[s : s + self.bs]
                yield torch.as_tensor(b), ds.x[b], torch.as_tensor(ds.y[b]).long()

    class DataManager:
        dataset_name = "tiny"

        def get_task_size(self, task):
            return PER_TASK

        def get_dataset(self, classes, source, mode, appendent=None, with_raw=False,
                        ret_data=False):  # fmt: skip
            x, y = (xtr_t, ytr) if source == "train" else (xte_t, yte)
            idx = np.nonzero(np.isin(y, classes))[0]
            ds = Dataset(idx, x, y)
            return (x[idx], y[idx], ds) if ret_data else ds

    from models import base as base_mod

    slca_mod.DataLoader = Loader
    base_mod.DataLoader = Loader
    slca_mod.weight_decay = 5e-4
    slca_mod.SLCA.save_checkpoint = lambda self, *a, **k: None

    # Recorders.
    rec: dict[str, list] = {"loss": [], "lr": [], "ca_loss": [], "draws": [], "perm": []}
    stage = {"ca": False}
    cross_entropy = slca_mod.F.cross_entropy

    def recording_ce(*a, **k):
        loss = cross_entropy(*a, **k)
        rec["ca_loss" if stage["ca"] else "loss"].append(float(loss.detach()))
        return loss

    slca_mod.F = types.SimpleNamespace(cross_entropy=recording_ce)
    sgd_step = torch.optim.SGD.step

    def recording_step(self, *a, **k):
        if not stage["ca"]:
            rec["lr"].append([g["lr"] for g in self.param_groups])
        return sgd_step(self, *a, **k)

    torch.optim.SGD.step = recording_step

    class RecordingNormal(slca_mod.MultivariateNormal):
        def sample(self, sample_shape=()):
            x = super().sample(torch.Size(sample_shape))
            rec["draws"].append(x.numpy().copy())
            return x

    slca_mod.MultivariateNormal = RecordingNormal
    randperm = torch.randperm

    def recording_randperm(*a, **k):
        p = randperm(*a, **k)
        rec["perm"].append(p.numpy().copy())
        return p

    stage2 = slca_mod.SLCA._stage2_compact_classifier

    def recording_stage2(self, task_size):
        stage["ca"] = True
        torch.randperm = recording_randperm
        try:
            stage2(self, task_size)
        finally:
            torch.randperm = randperm
            stage["ca"] = False

    slca_mod.SLCA._stage2_compact_classifier = recording_stage2

    torch.manual_seed(0)
    learner = slca_mod.SLCA(
        {"memory_size": 0, "memory_per_class": 0, "fixed_memory": False,
         "device": [torch.device("cpu")], "model_name": "slca", "model_postfix": "tiny",
         "prefix": "fixture", "run_id": 0, "seed": 0, "convnet_type": "vit-b-p16",
         "epochs": EPOCHS, "milestones": MILESTONES, "lr": LR, "bcb_lrscale": BCB_SCALE,
         "ca_epochs": CA_EPOCHS, "ca_with_logit_norm": LOGIT_NORM}
    )  # fmt: skip
    net = learner._network
    update_fc = type(net).update_fc
    heads = []

    def recording_update_fc(self, nb_classes, *a, **k):
        update_fc(self, nb_classes, *a, **k)
        lin = self.fc.heads[-1][-1]
        heads.append((lin.weight.detach().numpy().copy(), lin.bias.detach().numpy().copy()))

    type(net).update_fc = recording_update_fc
    out = {"images_train": xtr, "labels_train": ytr, "images_test": xte, "labels_test": yte}
    dm = DataManager()
    classes = TASKS * PER_TASK
    acc = np.full((TASKS, TASKS), np.nan, np.float32)
    for t in range(TASKS):
        n_loss, n_ca, n_draws = len(rec["loss"]), len(rec["ca_loss"]), len(rec["draws"])
        learner.incremental_train(dm)
        fc = net.fc
        weight = torch.cat([h[-1].weight for h in fc.heads]).detach().numpy()
        bias = torch.cat([h[-1].bias for h in fc.heads]).detach().numpy()
        before = fc.old_state_dict
        out[f"t{t}/head_init_weight"], out[f"t{t}/head_init_bias"] = heads[t]
        out[f"t{t}/loss"] = np.asarray(rec["loss"][n_loss:], np.float32)
        out[f"t{t}/lr"] = np.asarray(rec["lr"][n_loss:], np.float64)
        out[f"t{t}/ca_loss"] = np.asarray(rec["ca_loss"][n_ca:], np.float32)
        out[f"t{t}/fc_before_weight"] = torch.cat(
            [before[f"heads.{i}.0.weight"] for i in range(t + 1)]
        ).numpy()
        out[f"t{t}/fc_before_bias"] = torch.cat(
            [before[f"heads.{i}.0.bias"] for i in range(t + 1)]
        ).numpy()
        out[f"t{t}/fc_weight"], out[f"t{t}/fc_bias"] = weight, bias
        out[f"t{t}/means"] = learner._class_means.astype(np.float64)
        out[f"t{t}/covs"] = learner._class_covs.numpy().astype(np.float64)
        draws = rec["draws"][n_draws:]
        if draws:  # per CA epoch: one draw per class, then the shuffle
            seen = (t + 1) * PER_TASK
            feats, tgts = [], []
            perms = rec["perm"][-CA_EPOCHS:]
            for e in range(CA_EPOCHS):
                x = np.concatenate(draws[e * seen : (e + 1) * seen])
                y = np.repeat(np.arange(seen), 256)
                feats.append(x[perms[e]])
                tgts.append(y[perms[e]])
            out[f"t{t}/ca_inputs"] = np.stack(feats).astype(np.float32)
            out[f"t{t}/ca_targets"] = np.stack(tgts).astype(np.int8)
        if t in KEEP_PARAMS:
            for k, v in net.convnet.state_dict().items():
                out[f"t{t}/params/{k}"] = v.numpy().copy()
        net.eval()
        with torch.no_grad():
            logits = net(xte_t)["logits"].numpy()
        out[f"t{t}/logits"] = logits
        pred = logits.argmax(1)
        for i in range(t + 1):
            sel = (yte >= i * PER_TASK) & (yte < (i + 1) * PER_TASK)
            acc[i, t] = 100.0 * np.mean(pred[sel] == yte[sel])
        learner.after_task()
    out["accuracy"] = acc
    print("accuracy matrix (task i after task j):\n", acc, "classes", classes)
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
