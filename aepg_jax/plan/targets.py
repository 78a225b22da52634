"""Accelerator targets compiled without the accelerator: TPU slices and GPU hosts.

A target spec names the chip and the slice:

    tpu:<gen>:<topology>   gen v4 | v5e | v5p | v6e; topology the chip grid, e.g. v5e:4x4
                           (v5e-16, 4 hosts of 2x2), v5p:2x2x1 (v5p-8), v6e:2x2 (v6e-4);
                           aliases tpu:v5e-16, tpu:v5p-8, tpu:v6e-4, tpu:v4-8 ... are accepted
    gpu:<chip>[x<N>][:<H>] chip h100 | a100, N GPUs per host (1), H hosts (1): gpu:h100x8
    cpu                    this host's CPU devices (nominal chip figures; tests the machinery)

TPU devices come from libtpu's compile-only topology (`jax.experimental.topologies`, the libtpu
of jax's `tpu` extra); one device per chip (v4 and v5p as megacore). GPU devices come from the
CUDA PJRT plugin with a text `stream_executor.GpuTargetConfigProto` written here for the XLA in
jaxlib 0.10 (`GPU_SPECS`); XLA's autotuner needs a GPU, so Triton GEMM fusions are off for these
compiles (`--xla_gpu_enable_triton_gemm=false`; a real GPU autotunes and may do better).

Chip figures (`CHIPS`) are the vendors' published per-chip numbers: dense peak FLOP/s, HBM bytes
and bandwidth. f32 matmuls run at XLA's default precision (TPU: bf16 passes; H100/A100: TF32),
so the f32 peak is the bf16 (TPU) or TF32 (GPU) figure. GPU memory budget: the fraction of HBM
that jax preallocates (`XLA_PYTHON_CLIENT_MEM_FRACTION`, default 0.75).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jax

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class Chip:
    platform: str  # tpu | gpu
    hbm: int  # bytes per chip
    peak_bf16: float  # dense FLOP/s per chip
    peak_f32: float  # FLOP/s per chip of an f32 matmul at XLA's default precision
    bandwidth: float  # HBM bytes/s per chip
    description: str


CHIPS = {
    "v4": Chip("tpu", 32 * GiB, 275e12, 275e12, 1.228e12, "TPU v4"),
    "v5e": Chip("tpu", 16 * GiB, 197e12, 197e12, 0.819e12, "TPU v5e"),
    "v5p": Chip("tpu", 95 * GiB, 459e12, 459e12, 2.765e12, "TPU v5p"),
    "v6e": Chip("tpu", 32 * GiB, 918e12, 918e12, 1.640e12, "TPU v6e"),
    "h100": Chip("gpu", 84978434048, 989e12, 494.5e12, 3.35e12, "H100 SXM 80GB"),
    "a100": Chip("gpu", 85899345920, 312e12, 156e12, 2.039e12, "A100 SXM 80GB"),
    # The host (target `cpu`): nominal figures, for tests of the machinery.
    "cpu": Chip("cpu", 64 * GiB, 1e12, 1e12, 0.1e12, "host CPU"),
}

# libtpu's names: (topology generation name, chip config).
_TPU_NAMES = {
    "v4": ("v4", "megacore"),
    "v5e": ("v5e", "default"),
    "v5p": ("v5p", "megacore"),
    "v6e": ("v6e", "default"),
}
# Cloud names counting TensorCores (v4, v5p: 2 per chip) or chips (v5e, v6e) -> topology.
TPU_ALIASES = {
    "v4-8": "v4:2x2x1",
    "v4-16": "v4:2x2x2",
    "v4-32": "v4:2x2x4",
    "v5p-8": "v5p:2x2x1",
    "v5p-16": "v5p:2x2x2",
    "v5p-32": "v5p:2x2x4",
    "v5e-1": "v5e:1x1",
    "v5e-4": "v5e:2x2",
    "v5e-8": "v5e:2x4",
    "v5e-16": "v5e:4x4",
    "v5e-32": "v5e:4x8",
    "v5e-64": "v5e:8x8",
    "v5e-256": "v5e:16x16",
    "v6e-1": "v6e:1x1",
    "v6e-4": "v6e:2x2",
    "v6e-8": "v6e:2x4",
    "v6e-16": "v6e:4x4",
    "v6e-64": "v6e:8x8",
    "v6e-256": "v6e:16x16",
}

# GpuTargetConfigProto (text) fields accepted by the XLA of jaxlib 0.10: the devices' published
# limits (compute capability, SMs, shared memory, L2, clock, HBM size and bandwidth).
_GPU_SPEC = """gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {smem_core}
  threads_per_core_limit: 2048
  core_count: {sms}
  fpus_per_core: {fpus}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bw}
  l2_cache_size: {l2}
  clock_rate_ghz: {clock}
  device_memory_size: {mem}
  shared_memory_per_block_optin: {smem_optin}
  cuda_compute_capability {{
    major: {major}
    minor: 0
  }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{
  major: 9
  minor: 8
}}
device_description_str: "{name}"
"""
GPU_SPECS = {
    "h100": _GPU_SPEC.format(
        smem_core=233472,
        sms=132,
        fpus=128,
        bw=3352320000000,
        l2=52428800,
        clock=1.98,
        mem=84978434048,
        smem_optin=232448,
        major=9,
        name="NVIDIA H100 80GB HBM3",
    ),
    "a100": _GPU_SPEC.format(
        smem_core=167936,
        sms=108,
        fpus=64,
        bw=2039000000000,
        l2=41943040,
        clock=1.41,
        mem=85899345920,
        smem_optin=166912,
        major=8,
        name="NVIDIA A100-SXM4-80GB",
    ),
}


class TargetError(ValueError):
    """A target spec that cannot be built; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class Target:
    spec: str  # as given
    label: str  # e.g. "v5e-16 (4x4, 4 hosts)"
    chip_name: str
    chip: Chip
    devices: tuple  # compile-only devices, one per chip
    hosts: int

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s of the whole target for compute dtype `dtype`."""
        per_chip = self.chip.peak_bf16 if dtype == "bfloat16" else self.chip.peak_f32
        return per_chip * self.num_devices

    @property
    def budget(self) -> int:
        """Bytes a program may use per device (GPU: jax's preallocated fraction)."""
        if self.chip.platform == "tpu":
            return self.chip.hbm
        return int(self.chip.hbm * float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", 0.75)))


def _dims(topology: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+(x\d+){1,2}", topology):
        raise TargetError(f"TPU topology {topology!r} must look like 2x2 or 2x2x1.")
    return tuple(int(d) for d in topology.split("x"))


def _host_bounds(gen: str, dims: tuple[int, ...]) -> tuple[int, int, int]:
    """Chips per host: v5e / v6e slices up to 8 chips are one host, larger ones are hosts of
    2x2; v4 / v5p hosts hold 2x2x1."""
    dims3 = (*dims, 1, 1)[:3]
    n = dims3[0] * dims3[1] * dims3[2]
    if gen in ("v5e", "v6e") and n <= 8:
        return dims3
    return (min(2, dims3[0]), min(2, dims3[1]), 1)


@functools.cache
def _tpu_devices(gen: str, topology: str) -> tuple[tuple, int]:
    from jax.experimental import topologies

    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    name, chip_config = _TPU_NAMES[gen]
    bounds = _host_bounds(gen, _dims(topology))
    try:
        topo = topologies.get_topology_desc(
            platform="tpu",
            topology_name=f"{name}:{topology}",
            chip_config_name=chip_config,
            chips_per_host_bounds=bounds,
            num_slices=1,
            wrap=(False, False, False),
        )
    except Exception as err:  # libtpu missing or a topology it refuses
        raise TargetError(
            f"TPU {gen}:{topology} is not available for compiling ({_first_line(err)}); install "
            "the aot extra (bash scripts/install.sh aot) and use a valid topology."
        ) from err
    devices = tuple(topo.devices)
    return devices, len({d.process_index for d in devices})


@functools.cache
def _gpu_devices(chip: str, per_host: int, hosts: int) -> tuple:
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(
            platform="cuda",
            topology_name="",
            target_config=GPU_SPECS[chip],
            topology=f"1x{hosts}x{per_host}",
        )
    except Exception as err:
        hint = (
            "set JAX_PLATFORMS=cpu before jax starts (the CUDA plugin offers compile-only GPUs "
            "only then)"
            if "not implemented for cuda" in str(err)
            else "install the aot extra (bash scripts/install.sh aot: jax-cuda13-plugin without "
            "CUDA wheels, and ptxas)"
        )
        raise TargetError(
            f"GPU {chip} is not available for compiling ({_first_line(err)}); {hint}."
        ) from err
    return tuple(topo.devices)


_GPU_TARGET = r"gpu:(h100|a100)(?:x(\d+))?(?::(\d+))?"


def _jax():
    """jax, imported on first use: `kind` serves `aot_env`, which runs before jax may load."""
    import jax

    return jax


def kind(spec: str) -> str | None:
    """`tpu`, `gpu` or `cpu` for a well-formed `--target` spec, None for anything else."""
    parts = spec.split(":")
    if parts[0] == "tpu" and len(parts) == 2 and parts[1] in TPU_ALIASES:
        return "tpu"
    if parts[0] == "tpu" and len(parts) == 3 and parts[1] in _TPU_NAMES:
        return "tpu"
    if re.fullmatch(_GPU_TARGET, spec):
        return "gpu"
    return "cpu" if spec == "cpu" else None


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


def parse(spec: str) -> Target:
    """The `Target` of a `--target` spec (see the module docstring)."""
    parts = spec.split(":")
    if parts[0] == "tpu" and len(parts) == 2 and parts[1] in TPU_ALIASES:
        parts = ["tpu", *TPU_ALIASES[parts[1]].split(":")]
    if parts[0] == "tpu" and len(parts) == 3 and parts[1] in _TPU_NAMES:
        gen, topology = parts[1], parts[2]
        devices, hosts = _tpu_devices(gen, topology)
        n = len(devices)
        alias = {v: k for k, v in TPU_ALIASES.items()}.get(f"{gen}:{topology}", f"{gen}-{n}")
        label = f"{alias} ({topology}, {n} chips, {hosts} host{'s' * (hosts > 1)})"
        return Target(spec, label, gen, CHIPS[gen], devices, hosts)
    if spec == "cpu":  # the host itself: checks the plan's machinery without the extra
        devices = tuple(_jax().devices("cpu"))
        return Target(spec, f"host CPU ({len(devices)} devices)", "cpu", CHIPS["cpu"], devices, 1)
    m = re.fullmatch(_GPU_TARGET, spec)
    if m:
        chip, per_host, hosts = m.group(1), int(m.group(2) or 1), int(m.group(3) or 1)
        if per_host < 1 or hosts < 1:
            raise TargetError(f"--target={spec}: GPUs per host and hosts must be >= 1.")
        devices = _gpu_devices(chip, per_host, hosts)
        label = f"{hosts * per_host} x {chip.upper()}" + (f" ({hosts} hosts)" if hosts > 1 else "")
        return Target(spec, label, chip, CHIPS[chip], devices, hosts)
    raise TargetError(
        f"--target={spec} is not a target: use tpu:<v4|v5e|v5p|v6e>:<topology> (e.g. "
        f"tpu:v5e:4x4), an alias ({', '.join(sorted(TPU_ALIASES)[:4])}, ...) or "
        "gpu:<h100|a100>[x<per host>][:<hosts>] (e.g. gpu:h100x8)."
    )


def cpu_device() -> jax.Device:
    """The host's first CPU device (global FLOP counts come from programs lowered for it)."""
    return _jax().devices("cpu")[0]
