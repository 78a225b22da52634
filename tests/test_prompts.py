"""The prompt baselines (SPEC_BASELINES §0-§4, §7): external prefixes in the ViT, the query
pass, L2P++ / DualPrompt / CODA-P selection, Gram-Schmidt, parameter counts and end-to-end runs.

Everything runs on a tiny ViT (width 32, 2 or 4 blocks, 16 px); ViT-B/16 counts use
`jax.eval_shape` only.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aepg_jax import config_lib, partition
from aepg_jax.continual.methods import Network, prompting
from aepg_jax.models import vit

TINY = dict(patch_size=4, hidden_size=32, depth=4, num_heads=2, mlp_dim=64, image_size=16)


def _tiny_model(**overrides):
    return vit.model_config("vit_tiny", **{**TINY, **overrides})


def _images(batch=3, seed=0, size=16):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.uniform(-1, 1, (batch, size, size, 3)), jnp.float32)


def _params(cfg, heads=(4,), seed=0):
    return vit.init_params(cfg, jax.random.key(seed), heads)


# -- shared machinery ------------------------------------------------------------------------


def test_zero_length_prefix_leaves_the_output_exactly_unchanged():
    cfg = _tiny_model()
    params, x = _params(cfg), _images()
    model = vit.build(cfg, (4,))
    plain, out = model.apply({"params": params}, x, return_tokens=True)
    empty = jnp.zeros((3, 0, 32))
    for prefixes in (None, {}, {0: (empty, empty), 3: (empty, empty)}):
        logits, out2 = model.apply({"params": params}, x, return_tokens=True, prefixes=prefixes)
        np.testing.assert_array_equal(logits, plain)
        np.testing.assert_array_equal(out2["tokens"], out["tokens"])


def test_prefix_changes_attention_only_where_given_and_keeps_the_sequence_length():
    cfg = _tiny_model()
    params, x = _params(cfg), _images()
    model = vit.build(cfg, (4,))
    _, plain = model.apply({"params": params}, x, return_tokens=True)
    pk = jax.random.normal(jax.random.key(1), (3, 5, 32))
    _, out = model.apply({"params": params}, x, return_tokens=True, prefixes={2: (pk, pk + 1.0)})
    assert out["tokens"].shape == plain["tokens"].shape == (3, 1 + 16, 32)
    assert float(jnp.abs(out["features"] - plain["features"]).max()) > 1e-4
    with pytest.raises(ValueError, match="block 4"):
        model.apply({"params": params}, x, prefixes={4: (pk, pk)})


def test_prefix_attention_matches_numpy():
    """Attention with a prefix = softmax over [tokens, prefix] of q k^T / sqrt(Dh), in NumPy;
    the prefixes are raw keys and values (not projected), split into heads like the keys."""
    rng = np.random.default_rng(2)
    b, n, h, d, length = 2, 5, 2, 4, 3
    x = jnp.asarray(rng.standard_normal((b, n, h * d)), jnp.float32)
    pk, pv = (jnp.asarray(rng.standard_normal((b, length, h * d)), jnp.float32) for _ in "kv")
    attn = vit.MultiHeadDotProductAttention(num_heads=h)
    p = attn.init(jax.random.key(3), x)["params"]
    ours = np.asarray(attn.apply({"params": p}, x, (pk, pv)))

    def proj(name):
        return np.einsum("bnc,chd->bnhd", x, p[name]["kernel"]) + p[name]["bias"]

    q = proj("query")
    k = np.concatenate([proj("key"), np.asarray(pk).reshape(b, length, h, d)], 1)
    v = np.concatenate([proj("value"), np.asarray(pv).reshape(b, length, h, d)], 1)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out = np.einsum("bhqk,bkhd->bqhd", w, v)
    expected = np.einsum("bqhd,hdc->bqc", out, p["out"]["kernel"]) + p["out"]["bias"]
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_query_is_the_frozen_cls_token_without_peft_and_carries_no_gradient():
    cfg = _tiny_model(peft={"kind": "lora"})
    params = _params(cfg)
    _, frozen = partition.split(params, partition.label_params(params), partition.TRAINABLE)
    net, x = Network(cfg), _images()
    q = prompting.query(net, frozen, x)
    backbone_cfg = _tiny_model()
    _, out = vit.build(backbone_cfg, ()).apply({"params": frozen}, x)
    np.testing.assert_array_equal(q, out["features"])
    grads = jax.grad(lambda f: jnp.sum(prompting.query(net, f, x) ** 2))(frozen)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads))


def test_cosine_and_normalize():
    q = jnp.array([[3.0, 4.0], [0.0, 0.0]])
    keys = jnp.array([[1.0, 0.0], [0.0, 2.0]])
    np.testing.assert_allclose(prompting.cosine(q, keys), [[0.6, 0.8], [0.0, 0.0]], atol=1e-7)
    assert prompting.cut_blocks((0, 1, 2, 3, 4), 4) == (0, 1, 2, 3)


def test_prompt_leaves_are_labelled_peft():
    tree = {"prompt": {"keys": jnp.zeros((3, 2))}, "head": {"task_0": {"bias": jnp.zeros(2)}}}
    labels = partition.label_params(tree)
    assert labels["prompt"]["keys"] == partition.PEFT
    assert labels["head"]["task_0"]["bias"] == partition.HEAD


def test_base_config_validates_with_every_prompt_field():
    config_lib.validate(config_lib.base_config("vit_tiny"))
