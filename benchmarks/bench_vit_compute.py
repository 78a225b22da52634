"""Forward and forward+backward time of the ViT alone, to see where a train step's time goes.

Jits our model's forward pass and `jax.grad` of a cross-entropy on it with respect to the PEFT
and head leaves only (the frozen backbone is a non-differentiated argument, as in the train
step), on one batch of constant images; prints the median over `--steps` calls after one
warm-up call, the page faults and the system CPU time per call. No augmentation, no optimizer:
compare with `benchmarks/bench_step.py`, which times the whole step.

    python benchmarks/bench_vit_compute.py                          # ViT-B/16, LoRA, batch 8
    XLA_FLAGS=--xla_cpu_use_onednn=true python benchmarks/bench_vit_compute.py
    python benchmarks/bench_vit_compute.py --dtype bfloat16
    python benchmarks/bench_vit_compute.py --no-page-faults         # glibc keeps freed memory

`--no-page-faults` applies `aepg_jax.system.memory.keep_pages_mapped()` (glibc `mallopt`: one arena,
no mmap for large blocks, never trim) before JAX starts, so XLA:CPU's temporaries reuse mapped
pages instead of faulting them in afresh every call (Linux with glibc only). Without the flag
the script keeps glibc's defaults (it does not apply `aepg_jax.main`'s `AEPG_MALLOC` policy).
The timing is `step_harness.py`'s `measure`, shared with the other step benchmarks.
"""

from __future__ import annotations

import argparse
import os


def main(argv: list[str] | None = None) -> dict[str, tuple[float, float, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="vit_b16", help="a models/vit.py preset")
    parser.add_argument("--peft", default="lora", choices=("lora", "adapter", "prefix"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-page-faults", action="store_true")
    args = parser.parse_args(argv)
    if args.no_page_faults:
        from aepg_jax.system import memory

        if not memory.keep_pages_mapped():
            raise SystemExit("error: --no-page-faults: glibc's mallopt is unavailable here")

    import jax  # after mallopt: JAX's allocations then follow it
    import jax.numpy as jnp
    from step_harness import measure

    from aepg_jax.models import head, partition, vit

    cfg = vit.model_config(args.preset)
    cfg.peft.kind = args.peft
    cfg.dtype = args.dtype
    params = vit.init_params(cfg, jax.random.PRNGKey(0))
    peft, frozen = partition.split(params, partition.label_params(params), partition.TRAINABLE)
    trainable = head.grow(peft, jax.random.PRNGKey(1), 20, cfg.hidden_size)
    model = vit.build(cfg, (20,))
    images = jnp.ones((args.batch, cfg.image_size, cfg.image_size, 3), jnp.float32)

    def loss(trainable, frozen, images):
        logits, _ = model.apply({"params": partition.merge(trainable, frozen)}, images)
        return -jnp.mean(jax.nn.log_softmax(logits)[:, 0])

    forward, grad = jax.jit(loss), jax.jit(jax.grad(loss))
    results = {
        "forward": measure(
            lambda: forward(trainable, frozen, images).block_until_ready(), args.steps
        ),
        "forward+backward": measure(
            lambda: jax.block_until_ready(grad(trainable, frozen, images)), args.steps
        ),
    }
    print(
        f"{args.preset} {args.peft} batch {args.batch} {args.dtype}, {os.cpu_count()} CPU "
        f"threads, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, "
        f"no_page_faults={args.no_page_faults}"
    )
    for name, (seconds, faults, system) in results.items():
        print(
            f"{name:<17} {seconds:7.3f} s  {args.batch / seconds:6.2f} img/s  "
            f"{faults:9.0f} page faults  {system:5.2f} s system CPU per call"
        )
    return results


if __name__ == "__main__":
    main()
