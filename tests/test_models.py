"""Tests for aepg_jax.models: ViT presets and parameter names, PEFT modules, growing heads."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from aepg_jax.models import head, partition, peft, vit

KINDS = peft.PEFT_KINDS


# Smaller than the vit_tiny preset, to keep compile times low on a 2-core CI machine.
TEST_MODEL = dict(patch_size=4, hidden_size=32, depth=2, num_heads=2, mlp_dim=64, image_size=16)
WIDTH = TEST_MODEL["hidden_size"]


def _tiny(kind="none", **overrides):
    return vit.model_config("vit_tiny", peft={"kind": kind}, **{**TEST_MODEL, **overrides})


def _images(cfg, batch=3, seed=0):
    rng = np.random.default_rng(seed)
    shape = (batch, cfg.image_size, cfg.image_size, cfg.num_channels)
    return jnp.asarray(rng.uniform(-1, 1, shape), jnp.float32)


def _apply(cfg, params, images, return_tokens=False):
    model = vit.build(cfg, head.head_sizes(params))
    forward = jax.jit(model.apply, static_argnames="return_tokens")
    return forward({"params": params}, images, return_tokens=return_tokens)


class PresetTest(parameterized.TestCase):
    def test_vit_b16_parameter_count(self):
        cfg = vit.model_config("vit_b16")
        shapes = jax.eval_shape(lambda: vit.init_params(cfg, jax.random.key(0), (1000,)))
        self.assertEqual(partition.count(shapes)["total"], 86_567_656)

    def test_vit_b16_parameter_names_follow_vision_transformer(self):
        cfg = vit.model_config("vit_b16")
        shapes = jax.eval_shape(lambda: vit.init_params(cfg, jax.random.key(0)))
        names = set(partition.param_names(shapes))
        block = "Transformer/encoderblock_11/"
        expected = {
            "cls",
            "embedding/kernel",
            "embedding/bias",
            "Transformer/posembed_input/pos_embedding",
            "Transformer/encoder_norm/scale",
            "Transformer/encoder_norm/bias",
            block + "LayerNorm_0/scale",
            block + "LayerNorm_1/bias",
            block + "MultiHeadDotProductAttention_0/query/kernel",
            block + "MultiHeadDotProductAttention_0/out/kernel",
            block + "MlpBlock_0/Dense_0/kernel",
            block + "MlpBlock_0/Dense_1/bias",
        }
        self.assertTrue(expected <= names, expected - names)
        self.assertEqual(
            shapes["Transformer"]["posembed_input"]["pos_embedding"].shape, (1, 197, 768)
        )
        attn = shapes["Transformer"]["encoderblock_0"]["MultiHeadDotProductAttention_0"]
        self.assertEqual(attn["key"]["kernel"].shape, (768, 12, 64))
        self.assertEqual(attn["out"]["kernel"].shape, (12, 64, 768))

    @parameterized.product(preset=sorted(vit.PRESETS), kind=KINDS)
    def test_output_shapes(self, preset, kind):
        cfg = vit.model_config(preset, peft={"kind": kind})
        model = vit.build(cfg, (5, 3))
        params = jax.eval_shape(lambda: vit.init_params(cfg, jax.random.key(0), (5, 3)))
        images = jax.ShapeDtypeStruct((2, cfg.image_size, cfg.image_size, 3), jnp.float32)
        logits, out = jax.eval_shape(
            lambda p, x: model.apply({"params": p}, x, return_tokens=True), params, images
        )
        tokens = 1 + (cfg.image_size // cfg.patch_size) ** 2
        self.assertEqual(logits.shape, (2, 8))
        self.assertEqual(out["features"].shape, (2, cfg.hidden_size))
        self.assertEqual(out["tokens"].shape, (2, tokens, cfg.hidden_size))
        n_peft = partition.count(params, partition.label_params(params)).get("peft", 0)
        self.assertEqual(n_peft, peft.num_params(vit.peft_from_config(cfg.peft), cfg.hidden_size))

    def test_tiny_forward_runs_and_tokens_are_optional(self):
        cfg = _tiny()
        params = vit.init_params(cfg, jax.random.key(0), (4,))
        logits, out = _apply(cfg, params, _images(cfg))
        chex.assert_shape(logits, (3, 4))
        chex.assert_tree_all_finite((logits, out))
        self.assertNotIn("tokens", out)
        _, with_tokens = _apply(cfg, params, _images(cfg), return_tokens=True)
        np.testing.assert_array_equal(with_tokens["tokens"][:, 0], out["features"])

    def test_config_errors(self):
        with pytest.raises(ValueError, match="Unknown model preset 'vit_h14'"):
            vit.model_config("vit_h14")
        with pytest.raises(KeyError, match="Unknown model config field 'width'"):
            vit.model_config("vit_tiny", width=3)
        with pytest.raises(KeyError, match="Unknown peft field"):
            vit.model_config("vit_tiny", peft={"rank": 3})
        with pytest.raises(ValueError, match=r"peft.kind='loraa' is unknown; valid: none, lora"):
            vit.build(_tiny("loraa"))
        with pytest.raises(ValueError, match=r"name blocks beyond depth 2"):
            bad = vit.model_config(
                "vit_tiny", peft={"kind": "lora", "blocks": (0, 7)}, **TEST_MODEL
            )
            vit.build(bad).init(jax.random.key(0), _images(bad, 1))
        with pytest.raises(ValueError, match="not a multiple of patch_size"):
            vit.build(_tiny(image_size=30))
        with pytest.raises(ValueError, match="not divisible by num_heads"):
            vit.build(_tiny(num_heads=3))


class PeftTest(chex.TestCase):
    def _backbone_only(self, params):
        labels = partition.label_params(params)
        without_peft, _ = partition.split(params, labels, (partition.BACKBONE, partition.HEAD))
        return without_peft

    @parameterized.parameters("lora", "adapter")
    def test_identity_at_initialisation(self, kind):
        cfg = _tiny(kind)
        params = vit.init_params(cfg, jax.random.key(1), (4,))
        logits, out = _apply(cfg, params, _images(cfg))
        ref_logits, ref_out = _apply(_tiny("none"), self._backbone_only(params), _images(cfg))
        np.testing.assert_allclose(out["features"], ref_out["features"], atol=1e-6)
        np.testing.assert_allclose(logits, ref_logits, atol=1e-6)

    @parameterized.parameters("lora", "adapter", "prefix")
    def test_modules_sit_on_the_configured_blocks_only(self, kind):
        cfg = vit.model_config("vit_tiny", peft={"kind": kind, "blocks": (1, 3)})  # depth 4
        params = jax.eval_shape(lambda: vit.init_params(cfg, jax.random.key(0)))
        names = [n for n in partition.param_names(params) if f"/{kind}/" in n]
        blocks = {n.split("/")[1] for n in names}
        self.assertEqual(blocks, {"encoderblock_1", "encoderblock_3"})

    def test_lora_shapes_and_init(self):
        cfg = _tiny("lora")
        params = vit.init_params(cfg, jax.random.key(2))
        lora = params["Transformer"]["encoderblock_0"]["MultiHeadDotProductAttention_0"]["lora"]
        self.assertEqual(
            set(lora),
            {f"{b}_{p}" for b in ("key", "value") for p in "AB"} | {"key_scale", "value_scale"},
        )
        chex.assert_shape(lora["key_A"], (4, WIDTH))
        chex.assert_shape(lora["value_B"], (WIDTH, 4))
        np.testing.assert_array_equal(lora["key_B"], 0.0)
        np.testing.assert_array_equal(lora["value_scale"], 1.0)
        bound = 1 / np.sqrt(WIDTH)
        self.assertLessEqual(float(jnp.abs(lora["key_A"]).max()), bound)
        self.assertGreater(float(jnp.abs(lora["key_A"]).max()), 0.5 * bound)

    def test_lora_changes_only_keys_and_values(self):
        """A nonzero B changes the output exactly as `x W + s x A^T B^T` on K/V would."""
        x = jax.random.normal(jax.random.key(0), (2, 5, 16))
        module = vit.MultiHeadDotProductAttention(num_heads=2, lora_rank=3)
        params = module.init(jax.random.key(1), x)["params"]
        params["lora"]["key_B"] = jax.random.normal(jax.random.key(2), (16, 3))
        params["lora"]["value_scale"] = jnp.asarray(0.5)

        plain = vit.MultiHeadDotProductAttention(num_heads=2)
        merged = {k: v for k, v in params.items() if k != "lora"}
        lora = params["lora"]
        for name in ("key", "value"):
            delta = lora[f"{name}_scale"] * (lora[f"{name}_B"] @ lora[f"{name}_A"]).T
            merged[name] = dict(params[name])
            merged[name]["kernel"] = params[name]["kernel"] + delta.reshape(16, 2, 8)
        np.testing.assert_allclose(
            module.apply({"params": params}, x), plain.apply({"params": merged}, x), atol=1e-5
        )

    def test_lora_gradients_equal_the_formula(self):
        """`s (x A^T) B^T` (scale folded into B): output and A, B, s gradients as written."""
        x = jax.random.normal(jax.random.key(0), (2, 5, 16))
        module = peft.LoRA(3)
        params = module.init(jax.random.key(1), x)["params"]
        params["key_B"] = jax.random.normal(jax.random.key(2), (16, 3))
        params["key_scale"] = jnp.asarray(0.7)
        w = jax.random.normal(jax.random.key(3), (2, 5, 16))

        def ours(p):
            return jnp.sum(jnp.sin(module.apply({"params": p}, x)[0]) * w)

        def formula(p):
            hi = jax.lax.Precision.HIGHEST
            delta = p["key_scale"] * jnp.matmul(
                jnp.matmul(x, p["key_A"].T, precision=hi), p["key_B"].T, precision=hi
            )
            return jnp.sum(jnp.sin(delta) * w)

        np.testing.assert_allclose(ours(params), formula(params), rtol=1e-5)
        g, want = jax.grad(ours)(params), jax.grad(formula)(params)
        for name in ("key_A", "key_B", "key_scale"):
            self.assertGreater(float(jnp.max(jnp.abs(want[name]))), 1e-3)
            np.testing.assert_allclose(g[name], want[name], rtol=1e-4, atol=1e-5)

    def test_adapter_shapes_and_init(self):
        cfg = _tiny("adapter")
        params = vit.init_params(cfg, jax.random.key(3))
        adapter = params["Transformer"]["encoderblock_1"]["adapter"]
        chex.assert_shape(adapter["down"]["kernel"], (WIDTH, 5))
        chex.assert_shape(adapter["up"]["kernel"], (5, WIDTH))
        np.testing.assert_array_equal(adapter["down"]["bias"], 0.0)
        np.testing.assert_array_equal(adapter["up"]["kernel"], 0.0)
        np.testing.assert_array_equal(adapter["up"]["bias"], 0.0)
        np.testing.assert_array_equal(adapter["scale"], 1.0)
        self.assertLessEqual(float(jnp.abs(adapter["down"]["kernel"]).max()), 1 / np.sqrt(WIDTH))

    def test_prefix_shapes_and_init(self):
        cfg = _tiny("prefix")
        params = vit.init_params(cfg, jax.random.key(4))
        prefix = params["Transformer"]["encoderblock_0"]["MultiHeadDotProductAttention_0"]["prefix"]
        chex.assert_shape((prefix["key"], prefix["value"]), (10, WIDTH))
        for name in ("key", "value"):
            self.assertGreaterEqual(float(prefix[name].min()), 0.0)
            self.assertLessEqual(float(prefix[name].max()), 0.01)
            np.testing.assert_array_equal(prefix[f"{name}_scale"], 1.0)

    def test_prefix_attention_is_compensated(self):
        """attention = (1 - lam) attn_original + attn_prefix, checked against plain NumPy."""
        rng = np.random.default_rng(5)
        b, n, h, d, length = 2, 6, 2, 4, 3
        q, k, v = (rng.standard_normal((b, n, h, d)).astype(np.float32) for _ in range(3))
        pk, pv = (rng.standard_normal((length, h, d)).astype(np.float32) for _ in range(2))

        def softmax_attend(keys, values):
            s = np.einsum("bqhd,bkhd->bhqk", q, keys) / np.sqrt(d)
            w = np.exp(s - s.max(-1, keepdims=True))
            return w / w.sum(-1, keepdims=True), values

        full_k = np.asarray(peft.insert_prefix(jnp.asarray(k), jnp.asarray(pk)))
        full_v = np.asarray(peft.insert_prefix(jnp.asarray(v), jnp.asarray(pv)))
        np.testing.assert_array_equal(
            full_k[:, 1 : 1 + length], np.broadcast_to(pk, (b, *pk.shape))
        )
        np.testing.assert_array_equal(full_k[:, :1], k[:, :1])
        np.testing.assert_array_equal(full_k[:, 1 + length :], k[:, 1:])

        w_full, _ = softmax_attend(full_k, full_v)
        compensated = np.asarray(peft.compensate_prefix(jnp.asarray(w_full, jnp.float32), length))
        ours = np.einsum("bhqk,bkhd->bqhd", compensated, full_v)

        lam = w_full[..., 1 : 1 + length].sum(-1)  # (b, h, q)
        w_orig, _ = softmax_attend(k, v)
        attn_orig = np.einsum("bhqk,bkhd->bqhd", w_orig, v)
        s_prefix = np.einsum("bqhd,khd->bhqk", q, pk) / np.sqrt(d)
        w_prefix = np.exp(s_prefix - s_prefix.max(-1, keepdims=True))
        w_prefix /= w_prefix.sum(-1, keepdims=True)
        attn_prefix = np.einsum("bhqk,khd->bqhd", w_prefix, pv)
        expected = (1 - lam.transpose(0, 2, 1))[..., None] * attn_orig + attn_prefix
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)

    def test_prefix_effect_at_initialisation(self):
        """Prefix is not an identity at init (documented in peft.py); measure how far off."""
        cfg = _tiny("prefix")
        params = vit.init_params(cfg, jax.random.key(6), (4,))
        _, out = _apply(cfg, params, _images(cfg))
        _, ref = _apply(_tiny("none"), self._backbone_only(params), _images(cfg))
        rel = float(
            jnp.linalg.norm(out["features"] - ref["features"]) / jnp.linalg.norm(ref["features"])
        )
        self.assertGreater(rel, 1e-3)  # it does change the function ...
        self.assertLess(rel, 1.0)  # ... but keeps the features of the same order

    def test_two_peft_sets_share_one_compiled_forward(self):
        """LAE: online and offline PEFT parameters run through one trace of the forward pass."""
        cfg = _tiny("lora")
        params = vit.init_params(cfg, jax.random.key(7), (4,))
        labels = partition.label_params(params)
        online, rest = partition.split(params, labels, (partition.PEFT,))
        offline = jax.tree.map(lambda x: x + 0.1, online)
        model = vit.build(cfg, (4,))
        traces = []

        @jax.jit
        def forward(peft_params, rest_params, images):
            traces.append(None)
            return model.apply({"params": partition.merge(peft_params, rest_params)}, images)[0]

        x = _images(cfg)
        on, off = forward(online, rest, x), forward(offline, rest, x)
        self.assertLen(traces, 1)
        self.assertGreater(float(jnp.abs(on - off).max()), 1e-6)


class HeadTest(parameterized.TestCase):
    def test_grow_adds_a_head_and_leaves_the_rest(self):
        cfg = _tiny()
        params = vit.init_params(cfg, jax.random.key(0), (3,))
        grown = head.grow(params, jax.random.key(1), 5)
        self.assertEqual(head.head_sizes(grown), (3, 5))
        self.assertEqual(head.head_sizes(params), (3,))  # the input is not modified
        for path, leaf in partition._flat(params).items():
            np.testing.assert_array_equal(partition._flat(grown)[path], leaf)
        new = grown["head"]["task_1"]
        chex.assert_shape(new["kernel"], (WIDTH, 5))
        np.testing.assert_array_equal(new["bias"], 0.0)
        self.assertAlmostEqual(float(new["kernel"].std()), 1e-3, delta=3e-4)

        old_logits, _ = _apply(cfg, params, _images(cfg))
        new_logits, _ = _apply(cfg, grown, _images(cfg))
        chex.assert_shape(new_logits, (3, 8))
        np.testing.assert_array_equal(new_logits[:, :3], old_logits)

    def test_head_init_matches_grow(self):
        params = vit.init_params(_tiny(), jax.random.key(0), (200,))
        kernel = params["head"]["task_0"]["kernel"]
        self.assertAlmostEqual(float(kernel.std()), 1e-3, delta=1e-4)
        self.assertAlmostEqual(float(kernel.mean()), 0.0, delta=1e-4)

    def test_uniform_head_init_is_torch_linears_and_normal_is_unchanged(self):
        # torch's nn.Linear(D, n): weight and bias ~ U(-1/sqrt(D), 1/sqrt(D)), D = fan_in.
        width, n = 768, 400
        new = head.init_head(jax.random.key(3), width, n, "uniform")
        chex.assert_shape((new["kernel"], new["bias"]), ((width, n), (n,)))
        bound = 1 / np.sqrt(width)
        for leaf in (new["kernel"], new["bias"]):
            self.assertLessEqual(float(jnp.abs(leaf).max()), bound)
            self.assertGreater(float(jnp.abs(leaf).max()), 0.95 * bound)
        # U(-b, b) has std b / sqrt(3); the kernel's 307,200 draws pin it to ~0.2%.
        self.assertAlmostEqual(float(new["kernel"].std()) * np.sqrt(3) / bound, 1.0, delta=0.01)
        self.assertAlmostEqual(float(new["kernel"].mean()) / bound, 0.0, delta=0.01)
        # The default draws exactly what it always drew: KERNEL_INIT from the key, bias 0.
        normal = head.init_head(jax.random.key(3), width, n)
        np.testing.assert_array_equal(
            normal["kernel"], head.KERNEL_INIT(jax.random.key(3), (width, n), jnp.float32)
        )
        np.testing.assert_array_equal(normal["bias"], 0.0)
        with pytest.raises(ValueError, match="use one of"):
            head.init_head(jax.random.key(3), width, n, "xavier")

    def test_trunc_normal_head_init_is_timms(self):
        # timm's init_weights_vit_timm: trunc_normal_(std=.02) (bounds +-2, absolute), bias 0.
        new = head.init_head(jax.random.key(4), 768, 400, "trunc_normal")
        self.assertAlmostEqual(float(new["kernel"].std()), 0.02, delta=2e-4)
        self.assertLess(float(jnp.abs(new["kernel"]).max()), 0.2)
        self.assertEqual(new["kernel"].dtype, jnp.float32)
        np.testing.assert_array_equal(new["bias"], 0.0)

    def test_no_head_gives_empty_logits(self):
        cfg = _tiny()
        params = vit.init_params(cfg, jax.random.key(0))
        logits, out = _apply(cfg, params, _images(cfg))
        chex.assert_shape(logits, (3, 0))
        chex.assert_shape(out["features"], (3, WIDTH))

    def test_grow_rejects_empty_task(self):
        params = vit.init_params(_tiny(), jax.random.key(0))
        with pytest.raises(ValueError, match="at least one class"):
            head.grow(params, jax.random.key(1), 0)


class BFloat16Test(parameterized.TestCase):
    # Two kinds keep CI short: lora (changes K/V) and prefix (extra attention tokens).
    @parameterized.parameters("lora", "prefix")
    def test_bfloat16_compute_keeps_float32_params_and_logits(self, kind):
        cfg = _tiny(kind, dtype="bfloat16")
        params = vit.init_params(cfg, jax.random.key(0), (4,))
        self.assertTrue(all(x.dtype == jnp.float32 for x in jax.tree.leaves(params)))
        logits, out = _apply(cfg, params, _images(cfg))
        self.assertEqual(logits.dtype, jnp.float32)
        self.assertEqual(out["features"].dtype, jnp.float32)
        _, ref_out = _apply(_tiny(kind), params, _images(cfg))
        np.testing.assert_allclose(out["features"], ref_out["features"], atol=0.1, rtol=0.05)
        self.assertFalse(np.array_equal(out["features"], ref_out["features"]))  # really bf16
        model = vit.build(cfg, (4,))
        images = _images(cfg)
        grads = jax.jit(jax.grad(lambda p: model.apply({"params": p}, images)[0].sum()))(params)
        chex.assert_tree_all_finite(grads)
        self.assertTrue(all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads)))

    def test_unknown_dtype(self):
        with pytest.raises(ValueError, match=r"model\.dtype='float16' is unknown"):
            vit.build(_tiny(dtype="float16"))
