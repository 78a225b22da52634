"""The minimal JAX ViT LoRA train step that `bench_plan.py` plans beside ours.

A hand-written Flax ViT of a preset's sizes (separate q/k/v/out `nn.Dense` layers,
tanh-approximate GELU, LoRA on two of q/k/v of chosen blocks, a Dense head), float32 images
already on the device, softmax CE, `optax.adam` on LoRA + head only, frozen parameters a
separate jit argument, trainable parameters and Adam state donated. LoRA sits where the model's
PEFT config puts ours (its rank, on K and V of its blocks); `qv_all_blocks` puts rank 8 on Q and
V of every block instead.
"""

from __future__ import annotations

from collections.abc import Callable


def minimal_runner(model: str, batch: int, qv_all_blocks: bool) -> tuple[Callable[[], None], float]:
    """The minimal Flax ViT LoRA step (module docstring), compiled, on a device-resident batch."""
    return adam_step_runner(*minimal_parts(model, batch, qv_all_blocks))


def minimal_program(
    model: str, batch: int, dtype: str = "float32"
) -> tuple[Callable, tuple, tuple[int, ...]]:
    """`(step, args, donate_argnums)` of the minimal step (LoRA as `model.peft` places it) for
    lowering anywhere (`benchmarks/bench_plan.py`): `jax.jit(step, donate_argnums).lower(*args)`;
    `dtype` bfloat16 computes in bfloat16 with float32 parameters, as `model.dtype`."""
    grad_fn, trainable, frozen, images, labels = minimal_parts(model, batch, False, dtype)
    step, tx = _adam_step(grad_fn)
    return step, (trainable, tx.init(trainable), frozen, images, labels), (0, 1)


def minimal_parts(model: str, batch: int, qv_all_blocks: bool, dtype: str = "float32"):
    """`(grad_fn, trainable, frozen, images, labels)` of the minimal step (module docstring)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax
    from flax import traverse_util

    from aepg_jax.config import schema

    m = schema.base_config(model).model
    dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    rank = 8 if qv_all_blocks else m.peft.lora_rank
    lora_blocks = tuple(range(m.depth)) if qv_all_blocks else tuple(m.peft.blocks)
    targets = ("q", "v") if qv_all_blocks else ("k", "v")
    width, heads, num_classes = m.hidden_size, m.num_heads, 20

    class Block(nn.Module):
        lora: bool

        @nn.compact
        def __call__(self, x):
            b, n, _ = x.shape
            y = nn.LayerNorm(epsilon=1e-6, dtype=dt)(x)
            proj = {t: nn.Dense(width, dtype=dt, name=t)(y) for t in "qkv"}
            if self.lora:
                for t in targets:
                    a = self.param(f"lora_{t}_a", nn.initializers.lecun_uniform(), (width, rank))
                    w = self.param(f"lora_{t}_b", nn.initializers.zeros, (rank, width))
                    proj[t] = proj[t] + ((y @ a.astype(dt)) @ w.astype(dt)).astype(dt)
            q, k, v = (proj[t].reshape(b, n, heads, -1) for t in "qkv")
            att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1]))
            o = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, n, width)
            x = x + nn.Dense(width, dtype=dt, name="out")(o)
            y = nn.LayerNorm(epsilon=1e-6, dtype=dt)(x)
            y = nn.Dense(width, dtype=dt)(
                nn.gelu(nn.Dense(m.mlp_dim, dtype=dt)(y), approximate=True)
            )
            return x + y

    class ViT(nn.Module):
        @nn.compact
        def __call__(self, images):
            p = m.patch_size
            x = nn.Conv(width, (p, p), strides=(p, p), padding="VALID", dtype=dt)(images)
            x = x.reshape(x.shape[0], -1, width)
            cls = self.param("cls", nn.initializers.zeros, (1, 1, width)).astype(dt)
            x = jnp.concatenate([jnp.broadcast_to(cls, (x.shape[0], 1, width)), x], 1)
            x = x + self.param("pos", nn.initializers.normal(0.02), (1, *x.shape[1:])).astype(dt)
            for i in range(m.depth):
                x = Block(i in lora_blocks, name=f"block_{i}")(x)
            x = nn.LayerNorm(epsilon=1e-6, dtype=dt)(x)[:, 0]
            return nn.Dense(num_classes, name="head")(x.astype(jnp.float32))

    net = ViT()
    images = jnp.asarray(
        jax.random.normal(jax.random.PRNGKey(1), (batch, m.image_size, m.image_size, 3))
    )
    labels = jnp.arange(batch, dtype=jnp.int32) % num_classes
    flat = traverse_util.flatten_dict(net.init(jax.random.PRNGKey(0), images[:1])["params"])
    is_trainable = lambda path: path[0] == "head" or path[-1].startswith("lora_")
    pick = lambda keep: traverse_util.unflatten_dict(
        {k: v for k, v in flat.items() if is_trainable(k) == keep}
    )
    trainable, frozen = pick(True), pick(False)

    def loss(t, f, x, y):
        params = traverse_util.unflatten_dict(
            {**traverse_util.flatten_dict(t), **traverse_util.flatten_dict(f)}
        )
        logits = net.apply({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    return jax.value_and_grad(loss), trainable, frozen, images, labels


def _adam_step(grad_fn):
    """`(step(t, opt_state, f, x, y) -> (t, opt_state, loss), adam)`: Adam 1e-3, not jitted."""
    import optax

    tx = optax.adam(1e-3)

    def step(t, opt_state, f, x, y):
        value, grads = grad_fn(t, f, x, y)
        updates, opt_state = tx.update(grads, opt_state, t)
        return optax.apply_updates(t, updates), opt_state, value

    return step, tx


def adam_step_runner(
    grad_fn, trainable, frozen, images, labels
) -> tuple[Callable[[], None], float]:
    """The minimal step's harness: `grad_fn(trainable, frozen, x, y) -> (loss, grads)`, Adam
    1e-3 on the trainable leaves, trainable and Adam state donated; compiled."""
    import jax

    step, tx = _adam_step(grad_fn)
    step = jax.jit(step, donate_argnums=(0, 1))
    holder = [trainable, tx.init(trainable)]
    compiled = step.lower(*holder, frozen, images, labels).compile()

    def run() -> None:
        holder[0], holder[1], value = compiled(holder[0], holder[1], frozen, images, labels)
        jax.block_until_ready(value)

    return run, temp_mib(compiled)


def temp_mib(compiled) -> float:
    """XLA's temporary buffer size of one execution of a compiled step, MiB."""
    analysis = compiled.memory_analysis()
    return analysis.temp_size_in_bytes / 2**20 if analysis is not None else float("nan")
