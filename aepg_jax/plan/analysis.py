"""Compiling a program for a target and reading what XLA says about it.

Per device: argument / output / temporary bytes of `compiled.memory_analysis()`, peak =
arguments + outputs - aliased (donated) + temporaries. FLOPs and bytes accessed are XLA's cost
analysis: per device on TPU (times the device count: the global figure); GPU executables have
none, so FLOPs come from the same program lowered for the host CPU (global, before
partitioning) and bytes from the cost analysis of the compiled GPU module (custom-call GEMMs
count their operands and results). Collectives are read from the compiled HLO text.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import time

import jax
import numpy as np
from jax.sharding import Mesh

from aepg_jax.data import loader
from aepg_jax.plan.programs import Program
from aepg_jax.plan.targets import Target

_COLLECTIVE = re.compile(
    r"=\s*(\(.*?\)|\S+)\s+(all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)"
    r"(-start)?\("
)
_SHAPE = re.compile(r"\b(pred|s8|u8|s16|u16|s32|u32|s64|u64|bf16|f16|f32|f64)\[([\d,]*)\]")
_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "bf16": 2,
    "f16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
}


@dataclasses.dataclass(frozen=True)
class Cost:
    """What one compiled program costs on a target (memory per device, work globally)."""

    name: str
    images: int  # per call, all seeds
    argument: int
    output: int
    alias: int
    temp: int
    flops: float  # per call, all devices
    bytes_accessed: float  # per call, all devices
    collectives: dict  # (kind, dtype) -> [count, bytes per device]
    seconds: float  # compile time

    @property
    def peak(self) -> int:
        return self.argument + self.output - self.alias + self.temp

    def collectives_text(self) -> str:
        if not self.collectives:
            return "none"
        return ", ".join(
            f"{n} {kind} {dtype} ({b / 1024:.0f} KiB)"
            for (kind, dtype), (n, b) in sorted(self.collectives.items())
        )


class DoesNotFit(Exception):
    """XLA refused to place a program in the device's memory."""


def collectives(hlo_text: str) -> dict:
    """`(kind, dtype) -> [count, bytes]` of the collectives in compiled HLO text."""
    out: dict = collections.defaultdict(lambda: [0, 0])
    for line in hlo_text.splitlines():
        m = _COLLECTIVE.search(line)
        if not m:
            continue
        shapes = _SHAPE.findall(m.group(1))
        if m.group(3) and len(shapes) > 1 and m.group(2) != "all-reduce":
            shapes = shapes[-1:]  # an async start's tuple holds operand and result
        for dtype, dims in shapes:
            n = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
            entry = out[(m.group(2), dtype)]
            entry[0] += 1
            entry[1] += n * _BYTES[dtype]
    return dict(out)


def compile_cost(program: Program, target: Target) -> Cost:
    """Compiles `program` for `target`; raises `DoesNotFit` when XLA runs out of HBM."""
    mesh = Mesh(np.asarray(target.devices), (loader.DATA_AXIS,))
    start = time.perf_counter()
    try:
        compiled = program.lower(mesh).compile()
    except Exception as err:
        if "RESOURCE_EXHAUSTED" in str(err) or "Ran out of memory" in str(err):
            raise DoesNotFit(str(err)) from err
        raise
    seconds = time.perf_counter() - start
    mem = compiled.memory_analysis()
    n = target.num_devices
    if target.chip.platform == "tpu":
        cost = compiled.cost_analysis() or {}
        flops = float(cost.get("flops", 0.0)) * n
        accessed = float(cost.get("bytes accessed", 0.0)) * n
    else:
        flops = program.host_flops
        modules = compiled.runtime_executable().hlo_modules()
        client = jax.devices("cpu")[0].client
        from jax._src.lib import _jax

        accessed = (
            sum(
                float(_jax.hlo_module_cost_analysis(client, m).get("bytes accessed", 0.0))
                for m in modules
            )
            * n
        )
    return Cost(
        name=program.name,
        images=program.images,
        argument=mem.argument_size_in_bytes,
        output=mem.output_size_in_bytes,
        alias=mem.alias_size_in_bytes,
        temp=mem.temp_size_in_bytes,
        flops=flops,
        bytes_accessed=accessed,
        collectives=collectives(compiled.as_text()),
        seconds=seconds,
    )
