"""The continual-method interface: the registry, each method's config fields and checks, that
the loop reaches a method only through its hooks (a toy method added in the test runs, with
its state checkpointed and vmapped), and that no code outside `methods/` names a method."""

import pathlib
import re
from typing import ClassVar

import jax
import jax.numpy as jnp
import pytest
from test_driver import tiny_config

from aepg_jax import methods
from aepg_jax.config import schema
from aepg_jax.continual import setup, trainer
from aepg_jax.methods import base
from aepg_jax.runs import checkpointing

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "aepg_jax"


def test_registry_names_every_method_and_refuses_unknown_ones():
    assert set(methods.NAMES) >= {"plain", "lae", "lwf"}
    for name in methods.NAMES:
        assert methods.get(name).name == name
    with pytest.raises(ValueError, match=r"method.name='nope' is unknown; use one of plain"):
        methods.get("nope")


def test_config_has_every_methods_fields_and_checks_them():
    c = schema.base_config("vit_tiny")
    for method in methods.REGISTRY.values():
        for field, default in method.defaults.items():
            assert c.method[field] == default
    schema.validate(c)
    for field, bad in (("ema_decay", 1.0), ("lwf_weight", -1.0), ("lwf_temperature", 0.0)):
        c = schema.base_config("vit_tiny")
        c.method[field] = bad
        with pytest.raises(ValueError, match=rf"method\.{field}={bad}"):
            schema.validate(c)


def test_no_code_outside_the_methods_package_names_a_method():
    names = "|".join(n for n in methods.NAMES if n != "plain")
    pattern = re.compile(rf"""["']({names})["']""")
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        # Config argument parsing may name a method as a default value, and the paper's
        # experiments (paper.py, baselines.py, field_methods.py, field_claims.py) name the
        # methods of their runs as data; neither branches.
        experiments = ("paper.py", "baselines.py", "field_methods.py", "field_claims.py")
        if "methods" in path.parts or path.name in ("arguments.py", *experiments):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) or re.search(r"method\.name\s*[!=]=", line):
                offenders.append(f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


class _Counting(base.Method):
    """A toy method: its state counts optimizer steps; it reports two predictors, records what
    its host-side hooks saw, and does not train task 1 (no optimizer step there)."""

    name = "counting"
    predictors = ("model", "model_again")
    defaults: ClassVar[dict] = {}
    seen: ClassVar[list] = []

    def init_state(self, trainable):
        return {"count": jnp.zeros([], jnp.int32)}

    def begin_task(self, task, trainable, state, ctx):
        heads = len(trainable.get("head", {}))
        count = int(state["count"]) if state else 0
        self.seen.append(("begin", task.index, heads, count))
        return trainable, {"count": jnp.asarray(count, jnp.int32)}

    def end_task(self, task, trainable, state, ctx):
        self.seen.append(("end", task.index, len(trainable["head"]), int(state["count"])))
        return state

    def after_step(self, trainable, state, task):
        return {"count": state["count"] + 1}

    def trains_task(self, task):
        return task != 1

    def predict(self, net, trainable, frozen, state, images, task):
        probs, logits = super().predict(net, trainable, frozen, state, images, task)
        return {"model": probs["model"], "model_again": probs["model"]}, logits


def test_a_method_added_by_one_class_and_a_registry_entry_runs(tmp_path, monkeypatch):
    monkeypatch.setitem(methods.REGISTRY, "counting", _Counting)
    monkeypatch.setattr(_Counting, "seen", [])
    cfg = tiny_config(tmp_path / "cache", **{"data.num_tasks": 2, "max_steps_per_task": 3})
    cfg.method.name = "counting"  # the config is unlocked: a test-only name
    cfg.num_seeds = 2
    summary = trainer.run(cfg, str(tmp_path / "run"))
    assert summary["predictors"] == ["model", "model_again"]
    # Per seed: every task's head is there from the start (run-static shapes), the state
    # counts steps across tasks, task 1 (not trained) adds none but has its hooks.
    assert _Counting.seen == [
        ("begin", 0, 2, 0),
        ("begin", 0, 2, 0),
        ("end", 0, 2, 3),
        ("end", 0, 2, 3),
        ("begin", 1, 2, 3),
        ("begin", 1, 2, 3),
        ("end", 1, 2, 3),
        ("end", 1, 2, 3),
    ]
    a, b = (summary["metrics"][p]["A_T"]["values"] for p in ("model", "model_again"))
    assert a == b


@pytest.mark.parametrize(
    "overrides",
    [
        {"method.name": "aper"},
        {"method.name": "ease"},
        {"method.name": "ranpac", "method.ranpac_m": 8},
    ],
    ids=lambda o: o["method.name"],
)
def test_checkpoint_from_before_the_cosine_head_is_refused_in_one_line(tmp_path, overrides):
    """APER's, EASE's and RanPAC's cosine head moved (sigma at `cosine_scale`, the weights the
    task heads' kernels): a checkpoint saved before it (no `method_layout`) is refused."""
    cfg = tiny_config(tmp_path / "cache", **{"data.num_tasks": 2, **overrides})
    ckpt = checkpointing.Checkpointer(str(tmp_path / "run" / "checkpoints"))
    meta = {"task": 0, "phase": "task_done", "epoch": 0, "seeds": [0], "trackers": []}
    meta["state_layout"] = setup.STATE_LAYOUT
    ckpt.save(2, {"state": {"w": jax.numpy.zeros(3)}}, meta)
    ckpt.close()
    name = overrides["method.name"]
    with pytest.raises(
        ValueError,
        match=rf"keep {name}'s parameters in an older layout; .*cosine_scale.*use a new workdir\.$",
    ):
        trainer.run(cfg, str(tmp_path / "run"))


def test_checkpoint_of_the_older_state_layout_is_refused(tmp_path):
    cfg = tiny_config(tmp_path / "cache", **{"data.num_tasks": 2, "max_steps_per_task": 2})
    ckpt = checkpointing.Checkpointer(str(tmp_path / "run" / "checkpoints"))
    meta = {"task": 0, "phase": "task_done", "epoch": 0, "seeds": [0], "trackers": []}
    ckpt.save(2, {"state": {"w": jax.numpy.zeros(3)}}, meta)  # layout 1 had no `state_layout`
    ckpt.close()
    with pytest.raises(ValueError, match=r"older aepg_jax \(state layout 1.*use a new workdir"):
        trainer.run(cfg, str(tmp_path / "run"))
