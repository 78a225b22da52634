"""Generate tests/fixtures/official_hide_prompt.npz: HiDe-Prompt's official code end to end on
tiny inputs.

Runs thu-ml/HiDe-Prompt (commit 0ed4333) in its two stages, as `main.py` runs them on ImageNet-R
(`training_scripts/train_imr_vit.sh`): `engines/hide_tii_engine.py` `train_and_evaluate` (the
task-identity-inference model: frozen ViT, `MlpMapping` [2] and a classifier, trained, class
statistics, aligned) and then `engines/hide_promtp_wtp_and_tap_engine.py` `train_and_evaluate`
(prompts with momentum and the contrastive term, class statistics, task-adaptive alignment,
prediction through the first stage's per-task checkpoints), on:
  - the tiny timm ViT of tests/fixtures/timm_tiny_vit.safetensors (patch 8, 32 px, width 32,
    depth 2, 2 heads, MLP 128) built as `vits/hide_prompt_vision_transformer.VisionTransformer`
    (E-prompts on blocks 0, 1, pool 10, length 4, prefix tuning), its backbone weights loaded;
  - 2 tasks x 2 classes of 32 x 32 RGB uint8 images (numpy seed 0: a class colour plus noise),
    8 training and 4 test images per class, normalised to [-1, 1] (the project's
    `input.normalize=minus_one_one`), no augmentation; each epoch's batch order given (stored);
  - batch 8, Adam (weight decay 0, constant lr) with the gradient norm clipped at 1: TII lr 0.01
    for 3 epochs; prompts lr 0.05 and head 0.005 (`--larger_prompt_lr`) for 4 epochs,
    `prompt_momentum` 0.1, `reg` 0.5; `ca_storage_efficient_method=covariance`, 2 alignment
    epochs, `ca_lr` 0.05 (prompted heads, 40 draws per class) and 0.02 (TII, 8 per class).
Stand-ins (scaffolding only): the data loaders (given order; per class the images in order),
torch.distributed (one process: barrier a no-op, all_gather a copy), `torch.cuda.synchronize`,
`model.module` (the launch script's DistributedDataParallel wrapper), the logger's printing.
One change to the official code, kept deliberately (docs/algorithm.md §25): `EPrompt.forward`
reshapes its (layers, 2, B, ...) prompts to (layers, B, 2, ...) without a permute, so that
samples 0..B/2-1 get key tokens as keys and values and the others value tokens; here its output
is permuted back (each sample's keys its slot's key half, values the value half), as the
project's DualPrompt does (docs/algorithm.md §12).

Recorded: every training step's loss and learning rate (both stages), the alignment steps'
sampled features and labels (fed to the JAX side as they are) and losses, the initial
parameters, the prompts, heads and TII parameters after each task, the class means and
covariances of both stages, the test logits (TII and prompted) and the accuracy matrix.

Regenerate (needs the official code: `git clone https://github.com/thu-ml/HiDe-Prompt`):
    python3 -m venv /work/venv_hide
    /work/venv_hide/bin/pip install torch==2.13.0 numpy safetensors
    /work/venv_hide/bin/pip install --no-deps timm==0.6.13  # 0.6.7 (requirements.txt) fails
    /work/venv_hide/bin/python tests/official/hide_prompt/make_fixture.py --official=PATH
Generated with torch 2.13.0+cpu, timm 0.6.13 (torchvision stubbed:
benchmarks/_timm_import.py), Python 3.11, numpy 2.4.6, on CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "official"))
import fixture_data  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "official_hide_prompt.npz"
WEIGHTS = ROOT / "tests" / "fixtures" / "timm_tiny_vit.safetensors"

TASKS, PER_TASK, TRAIN_PER, TEST_PER = 2, 2, 8, 4
WIDTH, DEPTH, HEADS, PATCH, SIZE = 32, 2, 2, 8, 32
BATCH, EPOCHS, TII_EPOCHS, CA_EPOCHS = 8, 4, 3, 2
LENGTH, POOL, BLOCKS = 4, 10, [0, 1]
LR, TII_LR, TAP_LR, TII_CA_LR = 0.05, 0.01, 0.05, 0.02
MOMENTUM, REG = 0.1, 0.5


def make_data():
    return fixture_data.make_data(
        TASKS, PER_TASK, SIZE, TRAIN_PER, TEST_PER, max(EPOCHS, TII_EPOCHS)
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--official", required=True, help="a checkout of thu-ml/HiDe-Prompt")
    args_cli = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _timm_import

    _timm_import.import_timm()
    sys.path.insert(0, args_cli.official)
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file

    dist.barrier = lambda *a, **k: None

    def all_gather(out, t, *a, **k):
        out[0].copy_(t)

    dist.all_gather = all_gather
    torch.cuda.synchronize = lambda *a, **k: None
    torch.load = partial(torch.load, weights_only=False)  # its checkpoints hold `args`
    import types

    # `engines/__init__.py` imports every engine (the few-shot one needs scikit-learn): the
    # package is entered without it.
    engines = types.ModuleType("engines")
    engines.__path__ = [str(Path(args_cli.official) / "engines")]
    sys.modules["engines"] = engines
    import utils
    from engines import hide_promtp_wtp_and_tap_engine as wtp_engine
    from engines import hide_tii_engine as tii_engine
    from peft.prompt import hide_prompt as eprompt_mod
    from vits import hide_prompt_vision_transformer as hv

    # -- recording ----------------------------------------------------------------------------
    rec: dict[str, list] = {}
    stage = {"name": ""}

    def put(key, value):
        rec.setdefault(f"{stage['name']}/{key}", []).append(value)

    per_task: dict[str, dict[int, object]] = {}

    def put_task(key, task, value):  # the last value of each task (after its alignment)
        per_task.setdefault(f"{stage['name']}/{key}", {})[task] = value

    update = utils.MetricLogger.update

    def recording_update(self, **kwargs):
        for key in ("Loss", "Lr"):  # one update call each, once per step
            if key in kwargs:
                put(f"{stage.get('phase', 'train')}_{key.lower()}", float(kwargs[key]))
        return update(self, **kwargs)

    utils.MetricLogger.update = recording_update
    utils.MetricLogger.log_every = lambda self, iterable, *a, **k: iter(iterable)
    utils.MetricLogger.synchronize_between_processes = lambda self: None
    for engine in (tii_engine, wtp_engine):
        engine.print = lambda *a, **k: None
        accuracy = engine.accuracy

        def recording_accuracy(logits, target, topk=(1,), accuracy=accuracy):
            if stage.get("phase") == "align":
                put("align_labels", target.numpy().copy())
            return accuracy(logits, target, topk=topk)

        engine.accuracy = recording_accuracy
        tap = engine.train_task_adaptive_prediction

        def aligning(*a, tap=tap, **k):
            stage["phase"] = "align"
            tap(*a, **k)
            stage["phase"] = "train"

        engine.train_task_adaptive_prediction = aligning

    # The official E-prompt reshape without a permute, undone (module docstring).
    forward = eprompt_mod.EPrompt.forward

    def permuted_forward(self, *a, **k):
        out = forward(self, *a, **k)
        n, b, two, kl, h, hd = out["batched_prompt"].shape
        out["batched_prompt"] = (
            out["batched_prompt"].reshape(n, two, b, kl, h, hd).permute(0, 2, 1, 3, 4, 5)
        )
        return out

    eprompt_mod.EPrompt.forward = permuted_forward

    # -- data ---------------------------------------------------------------------------------
    xtr, ytr, xte, yte, orders = make_data()
    to_t = lambda u8: torch.tensor(u8.astype(np.float32) / 127.5 - 1.0).permute(0, 3, 1, 2)
    xtr_t, xte_t = to_t(xtr), to_t(xte)

    class Loader:
        def __init__(self, idx, x, y, epoch_orders=None):
            self.idx, self.x, self.y = idx, x, y
            self.epoch_orders, self.epoch = epoch_orders, 0

        def __len__(self):
            return -(-len(self.idx) // BATCH)

        def __iter__(self):
            order = self.idx
            if self.epoch_orders is not None:
                order = self.epoch_orders[self.epoch % len(self.epoch_orders)]
                self.epoch += 1
            for s in range(0, len(order), BATCH):
                b = order[s : s + BATCH]
                yield self.x[b], torch.as_tensor(self.y[b]).long()

    def loaders():
        data_loader = []
        for t in range(TASKS):
            tr = np.nonzero((ytr // PER_TASK) == t)[0]
            te = np.nonzero((yte // PER_TASK) == t)[0]
            data_loader.append(
                {"train": Loader(tr, xtr_t, ytr, orders[t]), "val": Loader(te, xte_t, yte)}
            )
        per_cls = [
            {"train": Loader(np.nonzero(ytr == c)[0], xtr_t, ytr)} for c in range(TASKS * PER_TASK)
        ]
        return data_loader, per_cls

    class_mask = [list(range(t * PER_TASK, (t + 1) * PER_TASK)) for t in range(TASKS)]
    target_task_map = {c: c // PER_TASK for c in range(TASKS * PER_TASK)}
    nb = TASKS * PER_TASK

    # -- models -------------------------------------------------------------------------------
    backbone = {k: v for k, v in load_file(str(WEIGHTS)).items() if not k.startswith("head.")}
    common = dict(
        img_size=SIZE, patch_size=PATCH, embed_dim=WIDTH, depth=DEPTH, num_heads=HEADS,
        mlp_ratio=4, qkv_bias=True, num_classes=nb,
        norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
    )  # fmt: skip
    freeze = ("blocks", "patch_embed", "cls_token", "norm", "pos_embed")

    def load(model):
        msg = model.load_state_dict(backbone, strict=False)
        assert not msg.unexpected_keys, msg
        for n, p in model.named_parameters():
            p.requires_grad = not n.startswith(freeze)
        return msg.missing_keys

    out = {"images_train": xtr, "labels_train": ytr, "images_test": xte, "labels_test": yte}
    out["orders"] = orders.astype(np.int32)
    workdir = Path(tempfile.mkdtemp())
    base = dict(
        batch_size=BATCH, nb_classes=nb, train_mask=True, task_inc=False, distributed=False,
        print_freq=10, num_tasks=TASKS, reinit_optimizer=True, sched="constant", opt="adam",
        weight_decay=0.0, opt_eps=1e-8, opt_betas=(0.9, 0.999), momentum=0.9, clip_grad=1.0,
        crct_epochs=CA_EPOCHS, ca_storage_efficient_method="covariance", world_size=1,
        model="vit_base_patch16_224", not_train_ca=False, n_centroids=10,
    )  # fmt: skip

    # Stage 1: task-identity inference.
    torch.manual_seed(0)
    original = hv.VisionTransformer(**common, mlp_structure=[2])
    missing = load(original)
    assert sorted(missing) == sorted(n for n, p in original.named_parameters() if p.requires_grad)
    sd = {k: v.detach().numpy().copy() for k, v in original.state_dict().items()}
    for k in ("mlp.net.0.0.weight", "mlp.net.0.0.bias", "mlp.net.1.0.weight", "mlp.net.1.0.bias"):
        out[f"tii_init/{k}"] = sd[k]
    out["tii_init/head.weight"], out["tii_init/head.bias"] = sd["head.weight"], sd["head.bias"]
    args = SimpleNamespace(
        **base, epochs=TII_EPOCHS, lr=TII_LR, ca_lr=TII_CA_LR, output_dir=str(workdir / "tii")
    )
    # Every probe of the model's fc_only forward (the alignment's inputs) recorded.
    fwd = hv.VisionTransformer.forward

    def recording_forward(self, x, *a, fc_only=False, **k):
        if fc_only:
            put("align_features", x.detach().numpy().copy())
        return fwd(self, x, *a, fc_only=fc_only, **k)

    hv.VisionTransformer.forward = recording_forward
    stage["name"], stage["phase"] = "tii", "train"
    data_loader, per_cls = loaders()
    optimizer = tii_engine.create_optimizer(args, original)
    evaluate_tii = tii_engine.evaluate_till_now

    def recording_eval_tii(model, *a, task_id=-1, **k):
        with torch.no_grad():
            put_task("logits", task_id, model(xte_t)["logits"].numpy().copy())
        sd = {kk: v.detach().numpy().copy() for kk, v in model.state_dict().items()}
        for kk in sd:
            if kk.startswith(("mlp.", "head.")):
                put_task(f"params/{kk}", task_id, sd[kk])
        return evaluate_tii(model, *a, task_id=task_id, **k)

    tii_engine.evaluate_till_now = recording_eval_tii
    with torch.no_grad():
        out["tii/test_features"] = original(xte_t)["pre_logits"].numpy()
    tii_engine.train_and_evaluate(
        original, original, torch.nn.CrossEntropyLoss(), data_loader, per_cls, optimizer, None,
        torch.device("cpu"), class_mask, target_task_map, args,
    )  # fmt: skip
    for c in range(nb):
        out[f"tii/mean_{c}"] = tii_engine.cls_mean[c].numpy()
        out[f"tii/cov_{c}"] = tii_engine.cls_cov[c].numpy()

    # Stage 2: within-task prediction and task-adaptive prediction.
    torch.manual_seed(1)
    model = hv.VisionTransformer(
        **common, prompt_length=LENGTH, embedding_key="cls", prompt_init="uniform",
        prompt_pool=True, prompt_key=False, pool_size=POOL, top_k=1, batchwise_prompt=False,
        prompt_key_init="uniform", head_type="token", use_prompt_mask=True, use_g_prompt=False,
        g_prompt_length=5, g_prompt_layer_idx=[], use_prefix_tune_for_g_prompt=False,
        use_e_prompt=True, e_prompt_layer_idx=BLOCKS, use_prefix_tune_for_e_prompt=True,
        same_key_value=False,
    )  # fmt: skip
    load(model)
    object.__setattr__(model, "module", model)  # the DDP wrapper's attribute the code uses
    out["wtp_init/prompt"] = model.e_prompt.prompt.detach().numpy().copy()
    out["wtp_init/head.weight"] = model.head.weight.detach().numpy().copy()
    out["wtp_init/head.bias"] = model.head.bias.detach().numpy().copy()
    original = hv.VisionTransformer(**common, mlp_structure=[2])
    load(original)
    for p in original.parameters():
        p.requires_grad = False
    args = SimpleNamespace(
        **base, epochs=EPOCHS, lr=LR, ca_lr=TAP_LR, output_dir=str(workdir / "wtp"),
        prompt_momentum=MOMENTUM, reg=REG, larger_prompt_lr=True,
        trained_original_model=str(workdir / "tii"), prompt_pool=True, shared_prompt_pool=True,
        shared_prompt_key=False, top_k=1, size=POOL, use_prefix_tune_for_e_prompt=True,
    )  # fmt: skip
    prompt_p = [p for n, p in model.named_parameters() if "prompt" in n and p.requires_grad]
    fc_p = [p for n, p in model.named_parameters() if "prompt" not in n and p.requires_grad]
    groups = [
        {"params": prompt_p, "lr": LR, "weight_decay": 0.0},
        {"params": fc_p, "lr": LR * 0.1, "weight_decay": 0.0},
    ]
    optimizer = wtp_engine.create_optimizer(args, groups)
    evaluate_wtp = wtp_engine.evaluate_till_now

    def recording_eval_wtp(model, original_model, *a, task_id=-1, acc_matrix=None, **k):
        with torch.no_grad():
            tii_logits = original_model(xte_t)["logits"]
            seen = torch.arange(nb) < (task_id + 1) * PER_TASK
            cls = torch.where(seen, tii_logits, torch.tensor(float("-inf"))).argmax(1)
            prompt_id = torch.tensor([target_task_map[int(v)] for v in cls]).unsqueeze(-1)
            logits = model(xte_t, task_id=task_id, prompt_id=prompt_id)["logits"]
        put_task("logits", task_id, logits.numpy().copy())
        put_task("prompt_id", task_id, prompt_id[:, 0].numpy().copy())
        put_task("prompt", task_id, model.e_prompt.prompt.detach().numpy().copy())
        put_task("head.weight", task_id, model.head.weight.detach().numpy().copy())
        put_task("head.bias", task_id, model.head.bias.detach().numpy().copy())
        return evaluate_wtp(model, original_model, *a, task_id=task_id, acc_matrix=acc_matrix, **k)

    wtp_engine.evaluate_till_now = recording_eval_wtp
    stage["name"], stage["phase"] = "wtp", "train"
    data_loader, per_cls = loaders()
    wtp_engine.train_and_evaluate(
        model, model, original, torch.nn.CrossEntropyLoss(), data_loader, per_cls, optimizer,
        None, torch.device("cpu"), class_mask, target_task_map, args,
    )  # fmt: skip
    for c in range(nb):
        out[f"wtp/mean_{c}"] = wtp_engine.cls_mean[c].numpy()
        out[f"wtp/cov_{c}"] = wtp_engine.cls_cov[c].numpy()

    for key, by_task in per_task.items():
        out[key] = np.stack([by_task[t] for t in range(TASKS)])
    for key, values in rec.items():
        if key.endswith(("_loss", "_lr")):
            out[key] = np.asarray(values, np.float32)
        else:
            out[key] = np.stack(values)
    # The accuracy matrix as the official code reports it (argmax over every class) and with
    # the classes of later tasks masked (the project's convention).
    for name, masked in (("accuracy", False), ("accuracy_masked", True)):
        acc = np.full((TASKS, TASKS), np.nan, np.float32)
        for t in range(TASKS):
            logits = out["wtp/logits"][t].copy()
            if masked:
                logits[:, (t + 1) * PER_TASK :] = -np.inf
            pred = logits.argmax(1)
            for i in range(t + 1):
                sel = (yte // PER_TASK) == i
                acc[i, t] = 100.0 * np.mean(pred[sel] == yte[sel])
        out[f"wtp/{name}"] = acc
        print(name, "(task i after task j):\n", acc)
    for k in sorted(out):
        print(k, np.shape(out[k]))
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
