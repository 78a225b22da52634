"""Times our jitted ViT PEFT train step against an eager PyTorch/timm reference step on the CPU.

For each PEFT kind (LoRA, adapter, prefix; SPEC §5, blocks 0-4) both sides run one complete
training step on the same uint8 batch (B, S, S, 3) with S = 256 for 224 px input:

* JAX: the real step of `aepg_jax.continual.train_step.make_train_step`, jitted with the state
  donated, built as the task loop builds it (`state.optimizer`, `setup.step_config` from
  `config_lib.base_config`): device-side RandomResizedCrop(224, scale (.05, 1)) + flip +
  normalisation, ViT forward, the task head, the loss (CE by default), gradients of the PEFT and
  head leaves only, Adam (optax, frozen backbone `set_to_zero`), plus the step's metrics
  (entropy, gradient norm). The host->device copy of the batch is inside the timed step.
* torch: timm `vit_base_patch16_224(pretrained=False)` (`--model vit_tiny`: a timm
  `VisionTransformer` of the tiny preset's sizes) with the same PEFT modules on blocks 0-4,
  backbone `requires_grad=False`, a Linear head, the same loss, `torch.optim.Adam` over the
  trainable parameters only, eager. Its augmentation runs in the timed step too, with torch ops
  on the uint8 batch: per image a torchvision-style RandomResizedCrop box (same scale/ratio
  rules), crop, `F.interpolate(bilinear, antialias=True)` to 224 (what torchvision does on
  tensors), flip p=.5, normalisation to [-1, 1].

`--torch-style timm` (default, the strongest eager baseline) keeps timm's fused
`scaled_dot_product_attention` wherever the math allows (not in prefix blocks, whose
compensation needs the softmax weights) and adds LoRA as a low-rank branch
`s (x A^T) B^T` like our model; `--torch-style lae` runs the LAE codebase's formulation
instead: explicit softmax attention in every block and LoRA merged into the fused qkv weight
(`F.linear(x, W_qkv + [0; s_k B_k A_k; s_v B_v A_v])`, LAE's `KVLoRA`).

The two sides alternate in one process: per PEFT kind, after building, compiling and
`--warmup` steps each, `--rounds` times N = `--steps` JAX steps then N torch steps, each step
timed alone; the reported figure is `batch / median step time` over all rounds. torch uses
`torch.set_num_threads(os.cpu_count())`; XLA's CPU client uses one device whose intra-op
thread pool spans all cores by default (XLA_FLAGS is printed when set). The model computes in
`--dtype float32` (default) or `bfloat16`: the JAX model computes in that dtype
(`model.dtype`: parameters, loss, head and logits stay float32); the torch step then runs its
forward pass and loss under `torch.autocast("cpu", dtype=torch.bfloat16)`.

    python scripts/bench_step.py --batch 8 --steps 5 --rounds 3 --peft lora,adapter,prefix \
        --image-size 224 --model vit_b16
    python scripts/bench_step.py --model vit_tiny            # quick check (seconds)
    python scripts/bench_step.py --model vit_tiny --jax-only # no torch needed

Memory: XLA's CPU runtime allocates its temporaries (about 1.4 GiB for a ViT-B/16 batch-8 step)
afresh every step; with glibc's defaults that costs ~0.4M page faults, ~1 CPU-s per step here.
The script applies `aepg_jax.memory.apply_default()` first, as `aepg_jax.main` does (freed
pages stay mapped; it applies to both sides); `AEPG_MALLOC=default` measures glibc's defaults.
The allocator state is printed with the results. Other processes' CPU use while timing is measured
and reported (a warning above 5%): on a shared 2-core machine it distorts the figures, torch's
most (its OpenMP threads stall when a core is taken).

torch and timm are optional (not project dependencies); without them the script prints the
install commands and exits with status 2 (`--jax-only` needs neither).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import _timm_import
import jax
import jax.numpy as jnp
import numpy as np

from aepg_jax import config_lib, losses, memory, partition, schedules
from aepg_jax.continual import methods, setup
from aepg_jax.continual import state as state_lib
from aepg_jax.continual import train_step as ts
from aepg_jax.models import head, vit

PEFT_KINDS = ("lora", "adapter", "prefix")
MODELS = ("vit_b16", "vit_tiny")
TIMM_NAMES = {"vit_b16": "vit_base_patch16_224"}
LOSSES = ("ce", "aepg")
TORCH_STYLES = ("timm", "lae")
FOREIGN_LOAD_WARN = 0.05
# Environment that changes both sides' memory allocation (printed with the results).
_ALLOC_ENV = (
    "GLIBC_TUNABLES",
    "LD_PRELOAD",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "OMP_NUM_THREADS",
)
TOTAL_STEPS = 10_000  # T of the aEPG alpha schedule (only its value at small t matters)

INSTALL_HELP = """\
The PyTorch reference step needs torch and timm (missing: {missing}). Install them into the
project venv (CPU wheel; a plain `pip install timm` would pull a CUDA torch):
    /work/main/.venv/bin/pip install torch==2.13.0
    /work/main/.venv/bin/pip install --no-deps timm
    /work/main/.venv/bin/pip install pyyaml huggingface_hub safetensors
or run only the JAX side with --jax-only."""


# --- shared ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Runner:
    """One side of the benchmark: `step()` runs one complete train step and returns when done."""

    name: str
    step: Callable[[], Any]
    setup_s: float  # build (+ compile) seconds
    batch: int
    model: Any = None  # the torch module (for inspection); None for JAX


def store_size(image_size: int) -> int:
    """The stored (pre-crop) image side: 256 for 224 px, in the same 8/7 proportion otherwise."""
    return round(image_size * 256 / 224)


def make_batch(batch: int, size: int, num_classes: int, seed: int) -> dict[str, np.ndarray]:
    """A random uint8 image batch (B, S, S, 3) and int32 labels in [0, num_classes)."""
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8),
        "label": rng.integers(0, num_classes, (batch,), dtype=np.int32),
    }


def time_steps(runner: Runner, n: int) -> list[float]:
    """Wall seconds of each of `n` consecutive steps."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        runner.step()
        times.append(time.perf_counter() - start)
    return times


class ForeignLoad:
    """CPU time used by *other* processes (and the hypervisor) while timing: a fairness check.

    From `/proc/stat` (all busy jiffies, steal included) minus this process's own CPU time,
    as a fraction of `wall x cores`; None where `/proc/stat` is unavailable.
    """

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        tick = os.sysconf("SC_CLK_TCK")
        busy = sum(fields[:8]) - fields[3] - fields[4]  # all but idle and iowait
        own = os.times()
        return busy / tick, own.user + own.system, time.perf_counter()

    def fraction(self) -> float | None:
        end = self._sample()
        if self._start is None or end is None:
            return None
        busy, own, wall = (b - a for a, b in zip(self._start, end, strict=True))
        return max(busy - own, 0.0) / max(wall * (os.cpu_count() or 1), 1e-9)


def run_config(
    model: str, kind: str, loss: str, image_size: int | None, dtype: str = "float32"
) -> Any:
    """The project config of one benchmark case (SPEC defaults otherwise)."""
    if model not in MODELS:
        raise ValueError(f"Unknown model {model!r}; valid: {', '.join(MODELS)}.")
    if kind not in PEFT_KINDS:
        raise ValueError(f"Unknown PEFT kind {kind!r}; valid: {', '.join(PEFT_KINDS)}.")
    if loss not in LOSSES:
        raise ValueError(f"Unknown loss {loss!r}; valid: {', '.join(LOSSES)}.")
    cfg = config_lib.base_config(model)
    cfg.model.peft.kind = kind
    cfg.model.dtype = dtype
    if image_size is not None:
        cfg.model.image_size = image_size
    cfg.loss.name = loss
    cfg.data.store_size = store_size(cfg.model.image_size)
    return cfg


# --- JAX side ----------------------------------------------------------------------------------


def make_jax_runner(
    model: str = "vit_b16",
    kind: str = "lora",
    batch: int = 8,
    image_size: int | None = None,
    num_classes: int = 20,
    loss: str = "ce",
    seed: int = 0,
    dtype: str = "float32",
) -> Runner:
    """Our jitted train step (task 0, no head-only phase), compiled, with a fixed uint8 batch."""
    start = time.perf_counter()
    cfg = run_config(model, kind, loss, image_size, dtype)
    key = jax.random.PRNGKey(seed)
    params = vit.init_params(cfg.model, jax.random.fold_in(key, 0))
    peft, frozen = partition.split(params, partition.label_params(params), partition.TRAINABLE)
    trainable = head.grow(peft, jax.random.fold_in(key, 1), num_classes, cfg.model.hidden_size)
    labels = partition.label_params(trainable)
    schedule = schedules.get_schedule(
        cfg.schedule.name, TOTAL_STEPS, **config_lib.schedule_kwargs(cfg)
    )
    task = methods.TaskSpec(
        index=0, offset=0, num_classes=num_classes, freeze_steps=0, head_sizes=(num_classes,)
    )
    optimizer = state_lib.optimizer(cfg, trainable)
    step_fn = ts.make_train_step(
        methods.get(cfg.method.name)(cfg),
        methods.Network(cfg.model),
        losses.get_loss(cfg.loss.name, **config_lib.loss_kwargs(cfg)),
        losses.is_annealed(cfg.loss.name),
        schedule,
        optimizer,
        labels,
        task,
        setup.step_config(cfg),
    )
    state = ts.TrainState(
        trainable=trainable,
        opt_state=optimizer.init(trainable),
        method_state={},
        task_step=jnp.zeros([], jnp.int32),
        global_step=jnp.zeros([], jnp.int32),
        rng=jax.random.fold_in(key, 7),
        first_bad_step=jnp.asarray(-1, jnp.int32),
    )
    host_batch = make_batch(batch, cfg.data.store_size, num_classes, seed)
    compiled = (
        jax.jit(step_fn, donate_argnums=(0,))
        .lower(state, frozen, jax.device_put(host_batch))
        .compile()
    )
    holder = {"state": state}

    def step() -> None:
        device_batch = jax.device_put(host_batch)
        holder["state"], metrics = compiled(holder["state"], frozen, device_batch)
        jax.block_until_ready((holder["state"], metrics))

    return Runner("jax", step, time.perf_counter() - start, batch)


def bench_jax(
    kind: str = "lora",
    model: str = "vit_tiny",
    batch: int = 8,
    steps: int = 3,
    rounds: int = 1,
    warmup: int = 1,
    image_size: int | None = None,
    num_classes: int = 20,
    loss: str = "ce",
) -> float:
    """Images per second of our train step alone: `batch / median step time` after warm-up."""
    runner = make_jax_runner(model, kind, batch, image_size, num_classes, loss)
    time_steps(runner, warmup)
    times = [t for _ in range(rounds) for t in time_steps(runner, steps)]
    return batch / statistics.median(times)


# --- torch side --------------------------------------------------------------------------------


def load_torch_and_timm() -> tuple[Any, Any]:
    """`(torch, timm)`, or print the install commands and exit with status 2."""
    try:
        timm = _timm_import.import_timm()
    except _timm_import.TorchMissingError as err:
        print(INSTALL_HELP.format(missing=", ".join(err.missing)), file=sys.stderr)
        sys.exit(2)
    import torch

    return torch, timm


def _torch_peft_attention(torch: Any) -> type:
    """The attention module with LoRA / prefix / adapter that replaces timm's in PEFT blocks."""
    nn, F = torch.nn, torch.nn.functional

    def uniform(shape: tuple[int, ...], low: float, high: float) -> Any:
        return nn.Parameter(torch.empty(shape).uniform_(low, high))

    class PeftAttention(nn.Module):
        """timm `Attention` (its qkv/proj modules reused) plus one PEFT module (SPEC §5).

        The adapter sits here because its input, LN1 x, is the attention's input: the block
        computes `x + Attn(LN1 x) + s Up(GELU(Down(LN1 x)))`.
        """

        def __init__(self, attn: Any, kind: str, peft: Any, style: str) -> None:
            super().__init__()
            self.qkv, self.proj = attn.qkv, attn.proj
            self.num_heads, self.head_dim = attn.num_heads, attn.head_dim
            self.kind, self.style = kind, style
            width = attn.qkv.in_features
            bound = 1.0 / math.sqrt(width)
            if kind == "lora":
                r = peft.lora_rank
                self.lora_a = nn.ParameterList([uniform((r, width), -bound, bound) for _ in "kv"])
                self.lora_b = nn.ParameterList([nn.Parameter(torch.zeros(width, r)) for _ in "kv"])
                self.lora_s = nn.ParameterList([nn.Parameter(torch.tensor(1.0)) for _ in "kv"])
            elif kind == "adapter":
                self.down = nn.Linear(width, peft.adapter_dim)
                self.up = nn.Linear(peft.adapter_dim, width)
                with torch.no_grad():
                    self.down.weight.uniform_(-bound, bound)
                    self.down.bias.zero_()
                    self.up.weight.zero_()
                    self.up.bias.zero_()
                self.adapter_s = nn.Parameter(torch.tensor(1.0))
            elif kind == "prefix":
                self.length = peft.prefix_length
                self.prefix = nn.ParameterList(
                    [uniform((self.length, width), 0.0, 0.01) for _ in "kv"]
                )
                self.prefix_s = nn.ParameterList([nn.Parameter(torch.tensor(1.0)) for _ in "kv"])
            else:
                raise ValueError(f"Unknown PEFT kind {kind!r}.")

        def _qkv(self, x: Any) -> tuple[Any, Any, Any]:
            if self.kind == "lora" and self.style == "lae":
                # LAE's KVLoRA: the low-rank update merged into the fused qkv weight.
                delta = torch.cat(
                    [
                        s * (b @ a)
                        for s, a, b in zip(self.lora_s, self.lora_a, self.lora_b, strict=True)
                    ],
                    0,
                )
                weight = self.qkv.weight + torch.cat(
                    [torch.zeros_like(self.qkv.weight)[: -delta.shape[0]], delta], 0
                )
                return F.linear(x, weight, self.qkv.bias).chunk(3, dim=-1)
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            if self.kind == "lora":
                dk, dv = (
                    s * ((x @ a.t()) @ b.t())
                    for s, a, b in zip(self.lora_s, self.lora_a, self.lora_b, strict=True)
                )
                k, v = k + dk, v + dv
            elif self.kind == "prefix":
                batch = x.shape[0]
                pk, pv = (
                    (s * p).expand(batch, -1, -1)
                    for s, p in zip(self.prefix_s, self.prefix, strict=True)
                )
                k = torch.cat([k[:, :1], pk, k[:, 1:]], dim=1)
                v = torch.cat([v[:, :1], pv, v[:, 1:]], dim=1)
            return q, k, v

        def forward(self, x: Any, attn_mask: Any = None, is_causal: bool = False) -> Any:
            del attn_mask, is_causal  # timm's Block passes them; a ViT uses neither
            batch, n, width = x.shape
            q, k, v = self._qkv(x)
            heads = lambda t: t.reshape(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)
            q, k, v = heads(q), heads(k), heads(v)
            if self.kind == "prefix" or self.style == "lae":
                weights = ((q * self.head_dim**-0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
                if self.kind == "prefix":
                    s, t = 1, 1 + self.length
                    lam = weights[..., s:t].sum(dim=-1, keepdim=True).clamp(min=1e-12)
                    weights = torch.cat(
                        [weights[..., :s], weights[..., s:t] / lam, weights[..., t:]], dim=-1
                    )
                out = weights @ v
            else:
                out = F.scaled_dot_product_attention(q, k, v)
            out = self.proj(out.transpose(1, 2).reshape(batch, n, width))
            if self.kind == "adapter":
                out = out + self.adapter_s * self.up(F.gelu(self.down(x)))
            return out

    return PeftAttention


def _torch_augment(torch: Any, gen: Any, images: Any, out: int, cfg: Any) -> Any:
    """RandomResizedCrop + flip + normalise of a uint8 NHWC batch -> float32 NCHW, torch ops.

    The box follows torchvision's `RandomResizedCrop.get_params` (10 attempts, then the
    centered fallback); the resize is `F.interpolate(bilinear, antialias=True)`, torchvision's
    tensor path.
    """
    F = torch.nn.functional
    batch, height, width, _ = images.shape
    area = height * width
    (s_lo, s_hi), (r_lo, r_hi) = cfg.data.crop_scale, cfg.data.crop_ratio
    log_lo, log_hi = math.log(r_lo), math.log(r_hi)
    x = images.permute(0, 3, 1, 2)
    crops = []
    for i in range(batch):
        box = None
        for _ in range(10):
            u = torch.rand(4, generator=gen).tolist()
            target = area * (s_lo + (s_hi - s_lo) * u[0])
            aspect = math.exp(log_lo + (log_hi - log_lo) * u[1])
            w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                box = (int(u[2] * (height - h + 1)), int(u[3] * (width - w + 1)), h, w)
                break
        if box is None:  # torchvision's fallback for a square image: the whole image
            side = min(height, width)
            box = ((height - side) // 2, (width - side) // 2, side, side)
        top, left, h, w = box
        crop = x[i : i + 1, :, top : top + h, left : left + w].float()
        crop = F.interpolate(
            crop, size=(out, out), mode="bilinear", align_corners=False, antialias=True
        )
        if torch.rand(1, generator=gen).item() < cfg.data.flip_prob:
            crop = crop.flip(-1)
        crops.append(crop)
    return ((torch.cat(crops).clamp_(0, 255) / 255.0 - 0.5) / 0.5).clamp_(-1.0, 1.0)


def _torch_model(torch: Any, timm: Any, cfg: Any, model: str, num_classes: int) -> Any:
    m = cfg.model
    if model in TIMM_NAMES:
        net = timm.create_model(
            TIMM_NAMES[model], pretrained=False, num_classes=num_classes, img_size=m.image_size
        )
    else:
        from timm.models.vision_transformer import VisionTransformer

        net = VisionTransformer(
            img_size=m.image_size,
            patch_size=m.patch_size,
            embed_dim=m.hidden_size,
            depth=m.depth,
            num_heads=m.num_heads,
            mlp_ratio=m.mlp_dim / m.hidden_size,
            num_classes=num_classes,
        )
    with torch.no_grad():
        net.head.weight.normal_(0.0, 1e-3)
        net.head.bias.zero_()
    return net


def make_torch_runner(
    torch: Any,
    timm: Any,
    model: str = "vit_b16",
    kind: str = "lora",
    batch: int = 8,
    image_size: int | None = None,
    num_classes: int = 20,
    loss: str = "ce",
    style: str = "timm",
    seed: int = 0,
    dtype: str = "float32",
) -> Runner:
    """The eager PyTorch reference step (see the module docstring) on the same uint8 batch."""
    if style not in TORCH_STYLES:
        raise ValueError(f"Unknown torch style {style!r}; valid: {', '.join(TORCH_STYLES)}.")
    start = time.perf_counter()
    cfg = run_config(model, kind, loss, image_size, dtype)
    torch.manual_seed(seed)
    net = _torch_model(torch, timm, cfg, model, num_classes)
    for p in net.parameters():
        p.requires_grad_(False)
    peft_cfg = vit.peft_from_config(cfg.model.peft)
    attention = _torch_peft_attention(torch)
    for i, blk in enumerate(net.blocks):
        if i in peft_cfg.blocks:
            blk.attn = attention(blk.attn, kind, peft_cfg, style)
        elif style == "lae":
            blk.attn.fused_attn = False  # LAE's own Attention computes the softmax explicitly
    for p in net.head.parameters():
        p.requires_grad_(True)
    net.train()
    trainable = [p for p in net.parameters() if p.requires_grad]
    o = cfg.optim
    optimizer = torch.optim.Adam(trainable, lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
    host_batch = make_batch(batch, cfg.data.store_size, num_classes, seed)
    images = torch.from_numpy(host_batch["image"])
    labels = torch.from_numpy(host_batch["label"]).long()
    gen = torch.Generator().manual_seed(seed)
    tau = cfg.schedule.tau
    counter = {"t": 0}

    def step() -> None:
        x = _torch_augment(torch, gen, images, cfg.model.image_size, cfg)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            logits = net(x)
        ce = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none")
        if loss == "aepg":
            t = counter["t"]
            alpha = 1.0 / (1.0 + math.exp(-tau * (TOTAL_STEPS - 2 * t) / TOTAL_STEPS))
            p_y = torch.exp(-ce)
            value = (alpha * ce - (1.0 - alpha) * p_y).mean()
        else:
            value = ce.mean()
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        counter["t"] += 1

    return Runner("torch", step, time.perf_counter() - start, batch, net)


# --- main --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    """Step times of one PEFT kind (seconds; per round, all rounds)."""

    kind: str
    batch: int
    jax_times: list[list[float]]
    torch_times: list[list[float]]
    jax_setup_s: float
    torch_setup_s: float
    foreign_load: float | None = None  # other processes' share of the CPU while timing

    @staticmethod
    def _ips(batch: int, rounds: list[list[float]]) -> float:
        return batch / statistics.median([t for r in rounds for t in r])

    @property
    def jax_ips(self) -> float:
        return self._ips(self.batch, self.jax_times)

    @property
    def torch_ips(self) -> float | None:
        return self._ips(self.batch, self.torch_times) if self.torch_times else None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _machine_lines(torch: Any, timm: Any, args: argparse.Namespace) -> list[str]:
    import flax
    import jaxlib
    import optax

    lines = [
        f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"machine: {platform.node()}, {_cpu_name()}, os.cpu_count()={os.cpu_count()}, "
        f"{platform.platform()}, Python {platform.python_version()}",
        f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, flax {flax.__version__}, "
        f"optax {optax.__version__}; devices {jax.devices()}; XLA CPU intra-op pool: all "
        f"cores (default); XLA_FLAGS={os.environ.get('XLA_FLAGS', '(unset)')}",
        f"aepg_jax.memory keep_pages_mapped applied: {args.kept_pages}; allocator env: "
        + (
            ", ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k in _ALLOC_ENV)
            or "none"
        ),
    ]
    if torch is not None:
        stubbed = ", ".join(_timm_import.stubbed_packages()) or "none"
        lines.append(
            f"torch {torch.__version__} (threads {torch.get_num_threads()}, interop "
            f"{torch.get_num_interop_threads()}), timm {timm.__version__} "
            f"(stubbed: {stubbed}); torch style: {args.torch_style}"
        )
    lines.append(
        f"compute dtype {args.dtype} (torch: autocast when bfloat16); loss "
        f"{args.loss}; {args.num_classes}-class head; steps={args.steps} x rounds={args.rounds}, "
        f"warmup={args.warmup}"
    )
    return lines


def _ms(seconds: float) -> str:
    ms = 1e3 * seconds
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}"


def _table(results: Sequence[Result], model: str) -> list[str]:
    header = (
        f"{'model':<9} {'peft':<8} {'batch':>5} {'JAX img/s':>10} {'torch img/s':>12} "
        f"{'JAX/torch':>10} {'JAX ms (round medians)':>28} {'torch ms (round medians)':>28} "
        f"{'JAX setup s':>12} {'torch setup s':>14} {'other load':>10}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        per_round = lambda rounds: "/".join(_ms(statistics.median(x)) for x in rounds)
        torch_ips = r.torch_ips
        lines.append(
            f"{model:<9} {r.kind:<8} {r.batch:>5} {r.jax_ips:>10.2f} "
            f"{(f'{torch_ips:.2f}' if torch_ips else '-'):>12} "
            f"{(f'{r.jax_ips / torch_ips:.2f}x' if torch_ips else '-'):>10} "
            f"{per_round(r.jax_times):>28} {(per_round(r.torch_times) or '-'):>28} "
            f"{r.jax_setup_s:>12.1f} {(f'{r.torch_setup_s:.1f}' if torch_ips else '-'):>14} "
            f"{(f'{100 * r.foreign_load:.0f}%' if r.foreign_load is not None else '?'):>10}"
        )
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per side per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per side first")
    parser.add_argument("--peft", default=",".join(PEFT_KINDS), help="comma-separated kinds")
    parser.add_argument("--image-size", type=int, default=None, help="default: the preset's")
    parser.add_argument("--model", choices=MODELS, default="vit_b16")
    parser.add_argument("--num-classes", type=int, default=20)
    parser.add_argument("--loss", choices=LOSSES, default="ce", help="the same on both sides")
    parser.add_argument("--torch-style", choices=TORCH_STYLES, default="timm")
    parser.add_argument("--jax-only", action="store_true", help="skip the torch side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.peft.split(",") if k.strip()]
    bad = [k for k in kinds if k not in PEFT_KINDS]
    if bad or not kinds:
        parser.error(f"--peft {args.peft!r}: choose from {', '.join(PEFT_KINDS)}")
    for name in ("batch", "steps", "rounds", "num_classes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    args.kinds = kinds
    return args


def main(argv: Sequence[str] | None = None) -> list[Result]:
    args = parse_args(argv)
    # What `aepg_jax.main` does before JAX's backend starts (AEPG_MALLOC; both sides share it).
    args.kept_pages = memory.apply_default()
    torch = timm = None
    if not args.jax_only:
        torch, timm = load_torch_and_timm()
        torch.set_num_threads(os.cpu_count() or 1)
    command = shlex.join([sys.executable, sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    print(f"command: {command}")
    for line in _machine_lines(torch, timm, args):
        print(line)
    common = dict(
        model=args.model,
        batch=args.batch,
        image_size=args.image_size,
        num_classes=args.num_classes,
        loss=args.loss,
        seed=args.seed,
        dtype=args.dtype,
    )
    results = []
    for kind in args.kinds:
        jax_runner = make_jax_runner(kind=kind, **common)
        torch_runner = None
        if torch is not None:
            torch_runner = make_torch_runner(
                torch, timm, kind=kind, style=args.torch_style, **common
            )
        runners = [r for r in (jax_runner, torch_runner) if r is not None]
        for runner in runners:
            time_steps(runner, args.warmup)
        times: dict[str, list[list[float]]] = {r.name: [] for r in runners}
        load = ForeignLoad()
        for _ in range(args.rounds):
            for runner in runners:
                times[runner.name].append(time_steps(runner, args.steps))
        result = Result(
            kind,
            args.batch,
            times["jax"],
            times.get("torch", []),
            jax_runner.setup_s,
            torch_runner.setup_s if torch_runner else 0.0,
            load.fraction(),
        )
        results.append(result)
        ratio = f", ratio {result.jax_ips / result.torch_ips:.2f}x" if result.torch_ips else ""
        torch_part = f", torch {result.torch_ips:.2f} img/s" if result.torch_ips else ""
        print(f"[{kind}] JAX {result.jax_ips:.2f} img/s{torch_part}{ratio}", flush=True)
        if result.foreign_load is not None and result.foreign_load > FOREIGN_LOAD_WARN:
            print(
                f"WARNING [{kind}]: other processes used {100 * result.foreign_load:.0f}% of the "
                "CPU while timing; the figures are not trustworthy (rerun on an idle machine).",
                flush=True,
            )
        del jax_runner, torch_runner, runners
        gc.collect()
    print()
    for line in _table(results, args.model):
        print(line)
    print(
        "img/s = batch / median step time over all rounds; ms columns: median step time of "
        "each round (JAX/torch alternate within a round); other load: CPU share used by other "
        "processes while timing."
    )
    return results


if __name__ == "__main__":
    main()
