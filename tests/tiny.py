"""The tiny continual config of the end-to-end tests (depth-2 ViT, 16 px digits, a few steps).

`tiny_config(cache_dir, **overrides)` builds it in a test; as a config file of
`aepg_jax.main` (`--config=tests/tiny.py:<spec.json>`, spec `{"cache": dir, "overrides": {..}}`)
it lets subprocess tests go through the real entry point. Imports nothing of `aepg_jax.main`
(a config file loaded by main must not define its flags a second time).
"""

import json
import pathlib
import resource

from aepg_jax.config import schema


def child_cpu_seconds() -> float:
    """CPU seconds of this process's ended children: what a bound on a subprocess's work
    measures, which a loaded machine does not stretch as it does wall-clock time."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def tiny_config(cache_dir, **overrides):
    c = schema.base_config("vit_tiny")
    c.model.update(
        dict(patch_size=4, hidden_size=32, depth=2, num_heads=2, mlp_dim=64, image_size=16)
    )
    c.model.peft.blocks = (0, 1)
    c.model.peft.kind = "lora"
    c.data.update(
        dict(
            source="digits",
            num_tasks=3,
            store_size=16,
            cache_dir=str(cache_dir),
            crop_scale=(0.5, 1.0),
            flip_prob=0.0,
        )
    )
    c.pretrain.cache_dir = str(cache_dir / "pretrained")
    c.optim.update(dict(batch_size=32, epochs=4, peft_freeze_epochs=2, learning_rate=3e-3))
    c.max_steps_per_task = 8
    c.log_every_steps = 2
    c.eval.batch_size = 64
    return apply_overrides(c, overrides)


def apply_overrides(c, overrides: dict):
    """Sets each `"a.b.c": value` of `overrides` on the config `c`; returns `c`."""
    for key, value in overrides.items():
        target = c
        *parents, leaf = key.split(".")
        for p in parents:
            target = target[p]
        target[leaf] = value
    return c


def write_spec(path, cache_dir, overrides) -> str:
    """Writes the spec file of `get_config`; returns the `--config=` value naming it."""
    path = pathlib.Path(path)
    path.write_text(json.dumps({"cache": str(cache_dir), "overrides": overrides}))
    return f"{pathlib.Path(__file__).resolve()}:{path}"


def get_config(arg):
    spec = json.loads(pathlib.Path(arg).read_text())
    return tiny_config(pathlib.Path(spec["cache"]), **spec["overrides"])
