"""aepg_jax.models.partition: labels, split/merge, the partitioned optimizer, frozen leaves."""

import chex
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized

from aepg_jax import losses
from aepg_jax.models import head, partition, peft, vit

TEST_MODEL = dict(patch_size=4, hidden_size=32, depth=2, num_heads=2, mlp_dim=64, image_size=16)


def _setup(kind="lora", head_sizes=(3,), seed=0):
    cfg = vit.model_config("vit_tiny", peft={"kind": kind}, **TEST_MODEL)
    params = vit.init_params(cfg, jax.random.key(seed), head_sizes)
    return cfg, params, partition.label_params(params)


def _batch(cfg, num_classes, batch=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (batch, cfg.image_size, cfg.image_size, 3)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(rng.integers(0, num_classes, batch), jnp.int32)


def _flat(tree):
    return {"/".join(k): v for k, v in partition._flat(tree).items()}


class LabelTest(parameterized.TestCase):
    @parameterized.parameters(*peft.PEFT_KINDS)
    def test_every_leaf_gets_the_right_label(self, kind):
        _, _, labels = _setup(kind)
        for name, label in _flat(labels).items():
            if f"/{kind}/" in name:
                self.assertEqual(label, partition.PEFT, name)
            elif name.startswith("head/"):
                self.assertEqual(label, partition.HEAD, name)
            else:
                self.assertEqual(label, partition.BACKBONE, name)
        self.assertIn("cls", _flat(labels))
        self.assertEqual(_flat(labels)["cls"], partition.BACKBONE)

    def test_unmatched_parameter_is_named(self):
        params = {"cls": jnp.zeros(3), "mystery": {"kernel": jnp.zeros(2)}}
        with pytest.raises(
            ValueError,
            match=r"1 parameter\(s\) match no partition rule: "
            r"mystery/kernel",
        ):
            partition.label_params(params)

    def test_custom_rules_first_match_wins(self):
        _, params, _ = _setup("lora")
        rules = [(r"encoderblock_0/", "peft"), *partition.DEFAULT_RULES]
        labels = _flat(partition.label_params(params, rules))
        self.assertEqual(labels["Transformer/encoderblock_0/LayerNorm_0/scale"], "peft")
        self.assertEqual(labels["Transformer/encoderblock_1/LayerNorm_0/scale"], "backbone")

    def test_split_and_merge_round_trip(self):
        _, params, labels = _setup("adapter")
        trainable, frozen = partition.split(params, labels, partition.TRAINABLE)
        self.assertEqual(set(trainable), {"Transformer", "head"})
        self.assertNotIn("embedding", trainable)
        chex.assert_trees_all_equal(partition.merge(trainable, frozen), params)
        with pytest.raises(ValueError, match="appears in more than one tree"):
            partition.merge(trainable, trainable)

    def test_count_per_label(self):
        cfg, params, labels = _setup("prefix", head_sizes=(3, 4))
        counts = partition.count(params, labels)
        self.assertEqual(counts["peft"], peft.num_params(vit.peft_from_config(cfg.peft), 32))
        self.assertEqual(counts["head"], 32 * 7 + 7)
        self.assertEqual(counts["total"], counts["peft"] + counts["head"] + counts["backbone"])

    def test_vit_b16_trainable_counts_match_the_formula(self):
        """LoRA r=4 / adapter 5 / prefix 10 on blocks 0-4 of ViT-B/16 (D = 768)."""
        expected = {
            "lora": 5 * 2 * (2 * 4 * 768 + 1),
            "adapter": 5 * (2 * 5 * 768 + 5 + 768 + 1),
            "prefix": 5 * 2 * (10 * 768 + 1),
        }
        for kind, n in expected.items():
            cfg = vit.model_config("vit_b16", peft={"kind": kind})
            shapes = jax.eval_shape(lambda cfg=cfg: vit.init_params(cfg, jax.random.key(0)))
            counts = partition.count(shapes, partition.label_params(shapes))
            self.assertEqual(counts["peft"], n, kind)
            self.assertEqual(counts["backbone"], 85_798_656, kind)
        self.assertEqual(expected, {"lora": 61_450, "adapter": 42_270, "prefix": 76_810})


class OptimizerTest(chex.TestCase):
    def test_frozen_leaves_have_no_state_and_never_change(self):
        cfg, params, labels = _setup("lora")
        opt = partition.make_optimizer(labels, optax.adam(1e-2))
        state = opt.init(params)
        # Adam moments exist only for trainable leaves; backbone leaves hold MaskedNode.
        adam_leaves = [
            leaf for leaf in jax.tree.leaves(state) if jnp.issubdtype(leaf.dtype, jnp.floating)
        ]
        n_trainable = partition.count(params, labels)
        n_state = sum(int(x.size) for x in adam_leaves)
        self.assertEqual(n_state, 2 * (n_trainable["peft"] + n_trainable["head"]))

        model = vit.build(cfg, (3,))
        x, y = _batch(cfg, 3)

        @jax.jit
        def step(p, s):
            g = jax.grad(
                lambda q: losses.cross_entropy(model.apply({"params": q}, x)[0], y).mean()
            )(p)
            u, s = opt.update(g, s, p)
            return optax.apply_updates(p, u), s

        new = params
        for _ in range(3):
            new, state = step(new, state)
        old_flat, new_flat, lab = _flat(params), _flat(new), _flat(labels)
        for name, label in lab.items():
            if label == partition.BACKBONE:
                np.testing.assert_array_equal(new_flat[name], old_flat[name], err_msg=name)
        moved = [
            n
            for n, lbl in lab.items()
            if lbl != partition.BACKBONE and not np.array_equal(new_flat[n], old_flat[n])
        ]
        self.assertTrue(any("/lora/" in n for n in moved))
        self.assertTrue(any(n.startswith("head/") for n in moved))

    def test_peft_gate_freezes_updates_and_state_without_recompiling(self):
        _, params, labels = _setup("lora")
        trainable, _ = partition.split(params, labels, partition.TRAINABLE)
        t_labels, _ = partition.split(labels, labels, partition.TRAINABLE)
        opt = partition.make_optimizer(t_labels, optax.adam(1e-2))
        state = opt.init(trainable)
        grads = jax.tree.map(jnp.ones_like, trainable)
        traces = []

        @jax.jit
        def update(s, train_peft):
            traces.append(None)
            return opt.update(grads, s, trainable, train_peft=train_peft)

        def peft_part(tree):
            return partition.split(tree, t_labels, (partition.PEFT,))[0]

        frozen_updates, frozen_state = update(state, jnp.asarray(False))
        chex.assert_trees_all_equal(
            peft_part(frozen_updates), jax.tree.map(jnp.zeros_like, peft_part(grads))
        )
        head_update = frozen_updates["head"]["task_0"]["kernel"]
        self.assertGreater(float(jnp.abs(head_update).min()), 0.0)
        # The gated label's Adam state did not advance; the head's did.
        peft_inner = frozen_state.inner_states["peft"].inner_state
        self.assertEqual(int(peft_inner.inner_state[0].count), 0)
        self.assertEqual(int(frozen_state.inner_states["head"].inner_state[0].count), 1)

        live_updates, live_state = update(frozen_state, jnp.asarray(True))
        self.assertGreater(
            min(float(jnp.abs(u).min()) for u in jax.tree.leaves(peft_part(live_updates))), 0.0
        )
        self.assertEqual(int(live_state.inner_states["peft"].inner_state.inner_state[0].count), 1)
        self.assertLen(traces, 1)

    def test_gate_defaults_to_training(self):
        _, params, labels = _setup("adapter")
        opt = partition.make_optimizer(labels, optax.sgd(1.0))
        updates, _ = opt.update(jax.tree.map(jnp.ones_like, params), opt.init(params), params)
        adapter = updates["Transformer"]["encoderblock_0"]["adapter"]["down"]["kernel"]
        np.testing.assert_array_equal(adapter, -1.0)


class GradientTest(chex.TestCase):
    def test_no_gradient_is_built_for_frozen_leaves(self):
        """The jaxpr of the trainable-only gradient computes nothing of a backbone kernel's shape.

        The patch-embedding kernel (P, P, C, D) appears only as a frozen input: no equation
        outputs that shape, while the full-parameter gradient's jaxpr does (the weight grad).
        """
        cfg, params, labels = _setup("lora")
        model = vit.build(cfg, (3,))
        x, y = _batch(cfg, 3)
        trainable, frozen = partition.split(params, labels, partition.TRAINABLE)

        def loss_fn(p):
            return losses.cross_entropy(model.apply({"params": p}, x)[0], y).mean()

        kernel_shape = params["embedding"]["kernel"].shape

        def outputs_kernel_shape(jaxpr) -> bool:
            def walk(jx):
                for eqn in jx.eqns:
                    if any(getattr(v.aval, "shape", None) == kernel_shape for v in eqn.outvars):
                        return True
                    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                        if walk(sub):
                            return True
                return False

            return walk(jaxpr.jaxpr)

        grad_trainable = partition.value_and_grad_trainable(loss_fn)
        self.assertFalse(outputs_kernel_shape(jax.make_jaxpr(grad_trainable)(trainable, frozen)))
        self.assertTrue(outputs_kernel_shape(jax.make_jaxpr(jax.grad(loss_fn))(params)))

        loss, grads = jax.jit(grad_trainable)(trainable, frozen)
        self.assertEqual(set(_flat(grads)), set(_flat(trainable)))
        full_loss, full_grads = jax.jit(jax.value_and_grad(loss_fn))(params)
        np.testing.assert_allclose(loss, full_loss, rtol=1e-6)
        full = _flat(full_grads)
        for name, g in _flat(grads).items():
            np.testing.assert_allclose(g, full[name], rtol=1e-5, atol=1e-7, err_msg=name)

    def test_train_step_compiles_once_per_task(self):
        cfg, params, labels = _setup("lora", head_sizes=(3,))
        opt = partition.make_optimizer
        traces = []

        def make_step(model, t_labels):
            tx = opt(t_labels, optax.adam(1e-3))

            @jax.jit
            def step(trainable, frozen, opt_state, x, y, train_peft):
                traces.append(None)

                def loss_fn(p):
                    return losses.cross_entropy(model.apply({"params": p}, x)[0], y).mean()

                loss, g = partition.value_and_grad_trainable(loss_fn)(trainable, frozen)
                u, opt_state = tx.update(g, opt_state, trainable, train_peft=train_peft)
                return optax.apply_updates(trainable, u), opt_state, loss

            return tx, step

        for task, n_classes in enumerate((3, 4)):
            if task:
                params = head.grow(params, jax.random.key(task), n_classes)
                labels = partition.label_params(params)
            model = vit.build(cfg, head.head_sizes(params))
            trainable, frozen = partition.split(params, labels, partition.TRAINABLE)
            t_labels, _ = partition.split(labels, labels, partition.TRAINABLE)
            tx, step = make_step(model, t_labels)
            opt_state = tx.init(trainable)
            for i in range(4):
                x, y = _batch(cfg, sum(head.head_sizes(params)), seed=i)
                train_peft = jnp.asarray(task == 0 or i >= 2)  # head-only first steps
                trainable, opt_state, loss = step(trainable, frozen, opt_state, x, y, train_peft)
                self.assertTrue(np.isfinite(float(loss)))
            params = partition.merge(trainable, frozen)
            self.assertLen(traces, task + 1)
