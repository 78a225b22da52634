"""Our explicit-softmax attention against `jax.nn.dot_product_attention`
(XLA implementation; cuDNN's needs a GPU to compile) in the plan's terms: task 1's LAE step of
`configs/imagenet_r.py` (ViT-B/16, batch 256) compiled for a target without it, temporaries and
XLA's bytes accessed per image. The alternative is patched in for this measurement only (plain
attention without prefixes, which is what LoRA runs).

    JAX_PLATFORMS=cpu nice -n 10 python benchmarks/bench_plan_attention.py --target=gpu:h100
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_triton_gemm=false"

import argparse

import flax.linen as nn
import jax

from aepg_jax.config import schema
from aepg_jax.models import peft as peft_lib
from aepg_jax.models import vit
from aepg_jax.plan import analysis, programs, shapes, targets

OURS = vit.MultiHeadDotProductAttention.__call__


@nn.compact
def fused_call(self, x, prefix=None):
    """`MultiHeadDotProductAttention` with the softmax attention of `jax.nn`."""
    width = x.shape[-1]
    head_dim = width // self.num_heads
    proj = lambda name: nn.DenseGeneral(
        (self.num_heads, head_dim),
        dtype=self.dtype,
        name=name,
        kernel_init=nn.initializers.xavier_uniform(),
    )
    q, k, v = proj("query")(x), proj("key")(x), proj("value")(x)
    if self.lora_rank:
        delta_k, delta_v = peft_lib.LoRA(self.lora_rank, name="lora")(x)
        k, v = k + delta_k.reshape(k.shape), v + delta_v.reshape(v.shape)
    assert not self.prefix_length and (prefix is None or not prefix[0].shape[1])
    attended = jax.nn.dot_product_attention(q, k, v, implementation="xla")
    return nn.DenseGeneral(
        width,
        axis=(-2, -1),
        dtype=self.dtype,
        name="out",
        kernel_init=nn.initializers.xavier_uniform(),
    )(attended)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", default="gpu:h100")
    p.add_argument("--dtypes", default="bfloat16,float32")
    a = p.parse_args()
    target = targets.parse(a.target)
    for dtype in a.dtypes.split(","):
        for name, call in (("explicit softmax", OURS), ("dot_product_attention", fused_call)):
            vit.MultiHeadDotProductAttention.__call__ = call
            cfg = schema.from_file("configs/imagenet_r.py", "tasks=10,method=lae")
            cfg.model.init, cfg.model.dtype = "random", dtype
            program = programs.train_programs(shapes.shape_run(cfg))[0]
            c = analysis.compile_cost(program, target)
            print(
                f"{target.label} {dtype} {name}: temp {c.temp / 2**30:.2f} GiB, "
                f"{c.bytes_accessed / c.images / 1e6:.1f} MB/img, "
                f"{c.flops / c.images / 1e9:.2f} GFLOP/img, compile {c.seconds:.0f} s",
                flush=True,
            )
    vit.MultiHeadDotProductAttention.__call__ = OURS


if __name__ == "__main__":
    main()
