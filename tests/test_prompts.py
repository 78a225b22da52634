"""The prompt baselines (docs/algorithm.md §10-§14): external prefixes in the ViT, the query
pass, L2P++ / DualPrompt / CODA-P selection, Gram-Schmidt, parameter counts and end-to-end runs.

Everything runs on a tiny ViT (width 32, 2 or 4 blocks, 16 px); ViT-B/16 counts use
`jax.eval_shape` only.
"""

import json
import shutil

import jax
import jax.numpy as jnp
import layout_npz
import numpy as np
import pytest
from test_driver import _read_jsonl, tiny_config
from test_multiseed import _assert_same_run

from aepg_jax.config import schema
from aepg_jax.continual import trainer
from aepg_jax.methods import (
    Network,
    TaskSpec,
    blocks,
    coda_prompt,
    dualprompt,
    l2p,
    prompting,
)
from aepg_jax.models import partition, vit
from aepg_jax.runs import records

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
    assert blocks.cut_blocks((0, 1, 2, 3, 4), 4) == (0, 1, 2, 3)


def test_prompt_leaves_are_labelled_peft():
    tree = {"prompt": {"keys": jnp.zeros((3, 2))}, "head": {"task_0": {"bias": jnp.zeros(2)}}}
    labels = partition.label_params(tree)
    assert labels["prompt"]["keys"] == partition.PEFT
    assert labels["head"]["task_0"]["bias"] == partition.HEAD


def test_base_config_validates_with_every_prompt_field():
    schema.validate(schema.base_config("vit_tiny"))


# -- helpers for the methods -------------------------------------------------------------------


def _method_config(name, preset="vit_tiny", num_tasks=3, **method_fields):
    c = schema.base_config(preset)
    if preset == "vit_tiny":
        c.model.update(TINY)
    c.method.name = name
    c.data.num_tasks = num_tasks
    c.method.update(method_fields)
    return c


def _grown(method, tasks=1, seed=0):
    """The trainable tree of `method` after growing tasks 0..tasks-1 (heads of 4 classes)."""
    width = method.cfg.model.hidden_size
    tree = {"head": {}}
    for t in range(tasks):
        tree["head"][f"task_{t}"] = {"kernel": jnp.zeros((width, 4)), "bias": jnp.zeros(4)}
        tree = method.grow(t, tree, jax.random.fold_in(jax.random.key(seed), t))
    return tree


def _count_prompts(tree):
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree["prompt"]))


def _orthonormal_error(rows):
    rows = np.asarray(rows, np.float64).reshape(rows.shape[0], -1)
    return float(np.abs(rows @ rows.T - np.eye(rows.shape[0])).max())


# -- CODA-P ------------------------------------------------------------------------------------


def test_coda_vit_b16_trainable_count():
    method = coda_prompt.CodaPrompt(_method_config("coda_prompt", "vit_b16", num_tasks=10))
    assert _count_prompts(_grown(method)) == 3_840_000


def test_coda_gram_schmidt_keeps_earlier_rows_and_orthonormalises_new_ones():
    method = coda_prompt.CodaPrompt(_method_config("coda_prompt", coda_pool_size=12))
    pt = 4  # 12 components over 3 tasks
    first = _grown(method, 1)["prompt"]
    second = _grown(method, 2)["prompt"]
    for name in ("keys", "attention", "components"):
        for b in range(first[name].shape[0]):
            r0, r1 = np.asarray(first[name][b]), np.asarray(second[name][b])
            assert _orthonormal_error(r0[:pt]) < 1e-5
            np.testing.assert_array_equal(r0[pt:], 0.0)  # used only from their task on
            np.testing.assert_array_equal(r1[:pt], r0[:pt])  # bit-identical
            assert _orthonormal_error(r1[: 2 * pt]) < 1e-5
            np.testing.assert_array_equal(r1[2 * pt :], 0.0)


def test_coda_gram_schmidt_after_training_is_orthogonal_to_the_trained_rows():
    rng = np.random.default_rng(0)
    rows = np.zeros((9, 40), np.float32)
    rows[:3] = rng.standard_normal((3, 40))  # trained rows: not orthogonal to each other
    out = coda_prompt.gram_schmidt(rows, 3, 6, jax.random.key(1))
    np.testing.assert_array_equal(out[:3], rows[:3])
    assert _orthonormal_error(out[3:6]) < 1e-5
    assert float(np.abs(out[:3] @ out[3:6].T).max()) < 1e-5
    np.testing.assert_array_equal(out[6:], 0.0)
    # More rows than dimensions: the rows past the 4th are random unit vectors, set by the key.
    full = coda_prompt.gram_schmidt(np.zeros((6, 4), np.float32), 0, 6, jax.random.key(2))
    assert _orthonormal_error(full[:4]) < 1e-5
    np.testing.assert_allclose(np.linalg.norm(full, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(
        full, coda_prompt.gram_schmidt(np.zeros((6, 4), np.float32), 0, 6, jax.random.key(2))
    )


def test_coda_weights_on_one_hot_keys_and_attention():
    eye = jnp.eye(6, 16)
    for j in range(6):
        w = coda_prompt.component_weights(jnp.eye(16)[j][None], eye, eye)
        np.testing.assert_allclose(w, np.eye(6)[j][None], atol=1e-7)


def test_coda_earlier_components_get_zero_gradients():
    method = coda_prompt.CodaPrompt(_method_config("coda_prompt", coda_pool_size=12))
    tree = _grown(method, 2)
    q = jax.random.normal(jax.random.key(3), (5, 32))

    def loss(prompts):
        prefixes, _ = method.prefixes(q, prompts, 1, train=True)
        return sum(jnp.sum(jnp.sin(pk)) + jnp.sum(pv**2) for pk, pv in prefixes.values())

    grads = jax.grad(loss)(tree["prompt"])
    for g in grads.values():
        np.testing.assert_array_equal(g[:, :4], 0.0)  # task 0's rows: frozen
        assert float(jnp.abs(g[:, 4:8]).max()) > 0  # task 1's rows train
        np.testing.assert_array_equal(g[:, 8:], 0.0)  # future rows: unused


def test_coda_ortho_penalty_only_with_its_weight():
    tree = _grown(coda_prompt.CodaPrompt(_method_config("coda_prompt", coda_pool_size=12)))
    q = jax.random.normal(jax.random.key(3), (2, 32))
    off = coda_prompt.CodaPrompt(_method_config("coda_prompt", coda_pool_size=12))
    on = coda_prompt.CodaPrompt(
        _method_config("coda_prompt", coda_pool_size=12, coda_ortho_weight=0.5)
    )
    assert off.prefixes(q, tree["prompt"], 0, train=True)[1] is None
    penalty = on.prefixes(q, tree["prompt"], 0, train=True)[1]
    assert 0.0 <= float(penalty) < 1e-8  # freshly orthonormal rows


def test_coda_checks_name_their_field():
    for field, bad, pattern in (
        ("coda_length", 7, r"method\.coda_length=7 must be even"),
        ("coda_pool_size", 2, r"method\.coda_pool_size=2 must be >= data\.num_tasks=3"),
        ("coda_blocks", (9,), r"method\.coda_blocks=\(9,\) has no block below model\.depth=4"),
        ("coda_ortho_weight", -1.0, r"method\.coda_ortho_weight=-1\.0 must be >= 0"),
        ("head_init", "xavier", r"method\.head_init='xavier': use one of"),
    ):
        c = _method_config("coda_prompt", **{field: bad})
        with pytest.raises(ValueError, match=pattern):
            schema.validate(c)


def test_every_methods_heads_start_as_its_official_codes_unless_head_init_says():
    """`method.head_init=official` (the default): torch's nn.Linear init for L2P++, CODA-P and
    InfLoRA, and RanPAC's and EASE's cosine classifiers, U(+-1/sqrt(D)); timm's trunc
    N(0, 0.02^2) for DualPrompt (dualprompt-pytorch), SLCA and HiDe-Prompt; SD-LoRA's
    `SimpleLinear`; N(0, 0.001^2) for plain, LAE, LwF (LAE's code) and the methods whose task
    heads are unused (docs/algorithm.md §18). Any other value is every method's heads'."""
    from aepg_jax import methods

    official = {
        "l2p": "uniform", "coda_prompt": "uniform", "inflora": "uniform", "ranpac": "uniform",
        "ease": "uniform", "dualprompt": "trunc_normal", "slca": "trunc_normal",
        "hide_prompt": "trunc_normal", "sd_lora": "linear",
    }  # fmt: skip
    for name, cls in methods.REGISTRY.items():
        assert cls(_method_config(name)).head_init == official.get(name, "normal"), name
        for init in ("normal", "uniform", "linear", "trunc_normal"):
            assert cls(_method_config(name, head_init=init)).head_init == init, name


@pytest.mark.slow
def test_a_coda_runs_heads_are_drawn_by_its_head_init(tmp_path):
    """The run's first trainable tree (every task's head): U(+-1/sqrt(D)) kernels and biases
    for CODA-P, N(0, 0.001^2) kernels and zero biases with `normal`, from the same keys."""
    from aepg_jax.continual import setup

    bound = 1 / np.sqrt(TINY["hidden_size"])
    heads = {}
    for init in ("uniform", "normal"):
        cfg = tiny_config(
            tmp_path / "cache", **{"method.name": "coda_prompt", "method.head_init": init}
        )
        run = setup.build(cfg, str(tmp_path / init))
        heads[init] = run.axis.unstack(setup.first_trainable(run))[0]["head"]
    assert len(heads["uniform"]) == 3  # every task's head from the start
    for t, uniform in heads["uniform"].items():
        normal = heads["normal"][t]
        assert 0.9 * bound < float(jnp.abs(uniform["kernel"]).max()) <= bound
        assert 0 < float(jnp.abs(uniform["bias"]).max()) <= bound
        assert float(jnp.abs(normal["kernel"]).max()) < 0.01
        np.testing.assert_array_equal(normal["bias"], 0.0)


# -- L2P++ ---------------------------------------------------------------------------------


def test_l2p_vit_b16_trainable_count():
    method = l2p.L2P(_method_config("l2p", "vit_b16", num_tasks=10))
    assert _count_prompts(_grown(method)) == 483_840


def test_l2p_selects_the_top_5_keys():
    """K = e_1..e_30 (one-hot rows), q = 5e3+4e7+3e1+2e9+1e2+0.5e5 -> {3, 7, 1, 9, 2}."""
    keys = jnp.eye(30, 768)
    q = jnp.zeros(768).at[jnp.array([3, 7, 1, 9, 2, 5])].set(jnp.array([5, 4, 3, 2, 1, 0.5]))
    idx, s = l2p.select(q[None], keys, 5)
    assert idx[0].tolist() == [3, 7, 1, 9, 2]
    np.testing.assert_allclose(s[0, 3], 5 / np.sqrt(55.25), rtol=1e-6)


def test_l2p_prefix_and_matching_loss():
    cfg = _method_config("l2p", l2p_pool_size=6, l2p_length=4, l2p_top_k=2)
    method = l2p.L2P(cfg)
    prompts = _grown(method)["prompt"]
    q = jax.random.normal(jax.random.key(0), (3, 32))
    prefixes, match = method.prefixes(q, prompts, 0, train=True)
    assert set(prefixes) == {0}
    pk, pv = prefixes[0]
    assert pk.shape == pv.shape == (3, 2 * 2, 32)
    idx, s = l2p.select(q, prompts["keys"][0], 2)
    chosen = prompts["prompts"][0][idx[1, 1]]  # sample 1's second prompt
    np.testing.assert_array_equal(pk[1, 2:], chosen[:2])
    np.testing.assert_array_equal(pv[1, 2:], chosen[2:])
    expected = sum(1 - s[b, idx[b, j]] for b in range(3) for j in range(2)) / 3
    np.testing.assert_allclose(match, expected, rtol=1e-6)
    assert method.prefixes(q, prompts, 0, train=False)[1] is None


# -- DualPrompt ----------------------------------------------------------------------------


def test_dualprompt_vit_b16_trainable_count():
    method = dualprompt.DualPrompt(_method_config("dualprompt", "vit_b16", num_tasks=10))
    assert _count_prompts(_grown(method)) == 944_640


def test_dualprompt_uses_the_task_slot_in_training_and_the_nearest_seen_key_at_test():
    cfg = _method_config("dualprompt", num_tasks=4, dualprompt_pool_size=4)
    method = dualprompt.DualPrompt(cfg)
    prompts = dict(_grown(method)["prompt"])
    prompts["keys"] = jnp.eye(4, 32)  # key j = e_j
    eye = jnp.eye(32)
    q = jnp.stack([eye[0], eye[3] + 0.5 * eye[2], eye[1]])  # nearest keys 0, 3 (unseen), 1
    e = prompts["e"]
    train, pull = method.prefixes(q, prompts, 2, train=True)
    for i, block in enumerate((2, 3)):  # e-blocks (2, 3, 4) cut at depth 4
        np.testing.assert_array_equal(train[block][0], jnp.broadcast_to(e[i, 0, 2], (3, 20, 32)))
        np.testing.assert_array_equal(train[block][1], jnp.broadcast_to(e[i, 1, 2], (3, 20, 32)))
    np.testing.assert_allclose(pull, -jnp.mean(prompting.cosine(q, prompts["keys"])[:, 2]))
    for block in (0, 1):  # g-prompts: 5 key and 5 value tokens, the same for every sample
        assert train[block][0].shape == (3, 5, 32)
    test, none = method.prefixes(q, prompts, 2, train=False)  # tasks 0..2 seen: 3 -> 2
    assert none is None
    np.testing.assert_array_equal(dualprompt.slots(q, prompts["keys"], 3), [0, 2, 1])
    np.testing.assert_array_equal(test[2][0][0], e[0, 0, 0])
    np.testing.assert_array_equal(test[2][1][2], e[0, 1, 1])


def test_dualprompt_copies_the_previous_slot_before_a_task():
    method = dualprompt.DualPrompt(_method_config("dualprompt"))
    trainable = _grown(method)
    spec = TaskSpec(index=2, offset=8, num_classes=4, freeze_steps=0, head_sizes=(4, 4))
    after, _ = method.begin_task(spec, trainable, {}, None)
    e0, e1 = trainable["prompt"]["e"], after["prompt"]["e"]
    np.testing.assert_array_equal(e1[:, :, 2], e0[:, :, 1])
    np.testing.assert_array_equal(e1[:, :, :2], e0[:, :, :2])
    np.testing.assert_array_equal(e1[:, :, 3:], e0[:, :, 3:])
    np.testing.assert_array_equal(after["prompt"]["keys"], trainable["prompt"]["keys"])


def test_l2p_and_dualprompt_checks_name_their_field():
    for name, field, bad, pattern in (
        ("l2p", "l2p_top_k", 40, r"method\.l2p_top_k=40 must be <= method\.l2p_pool_size=30"),
        ("l2p", "l2p_length", 5, r"method\.l2p_length=5 must be even"),
        ("l2p", "l2p_match_weight", -1.0, r"method\.l2p_match_weight=-1\.0"),
        ("dualprompt", "dualprompt_pool_size", 2, r"dualprompt_pool_size=2 must be >= data"),
        ("dualprompt", "dualprompt_e_blocks", (7,), r"dualprompt_e_blocks=\(7,\) has no block"),
        ("dualprompt", "dualprompt_g_length", 0, r"dualprompt_g_length=0 must be an integer"),
    ):
        with pytest.raises(ValueError, match=pattern):
            schema.validate(_method_config(name, **{field: bad}))


# -- every method: the query pass, end-to-end runs ------------------------------------------


def test_no_gradient_reaches_the_query_pass():
    """The train forward's gradients equal those with q(x) fed in as a constant."""
    cfg = _method_config("coda_prompt", coda_pool_size=12, coda_ortho_weight=0.1)
    method = coda_prompt.CodaPrompt(cfg)
    params = _params(cfg.model, heads=())
    _, frozen = partition.split(params, partition.label_params(params), partition.TRAINABLE)
    trainable = _grown(method, 2)
    net, x = Network(cfg.model), _images(seed=4)
    spec = TaskSpec(index=1, offset=4, num_classes=4, freeze_steps=0, head_sizes=(4, 4))

    def loss(tr, q=None):
        if q is None:
            logits, extra = method.forward(net, tr, frozen, {}, x, spec)
        else:
            logits, extra = method.prompted(net, tr, frozen, x, q, spec, train=True)
        return jnp.sum(jax.nn.log_softmax(logits)[:, 5]) + extra

    q = prompting.query(net, frozen, x)
    through_query = jax.jit(jax.grad(loss))(trainable)
    constant_query = jax.jit(jax.grad(loss))(trainable, q)
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)  # fusion only
    jax.tree.map(close, through_query, constant_query)
    assert float(jnp.abs(through_query["prompt"]["keys"]).max()) > 0


# The driver's tiny ViT has 2 blocks: DualPrompt's g-prompt on block 0, e-prompt on block 1.
E2E = {
    "data.num_tasks": 2,
    "max_steps_per_task": 4,
    "method.dualprompt_g_blocks": (0,),
    "method.dualprompt_e_blocks": (1,),
}


def _run(tmp_path, name, workdir=None, **overrides):
    cfg = tiny_config(tmp_path / "cache", **{**E2E, "method.name": name, **overrides})
    workdir = tmp_path / (workdir or name)
    return trainer.run(cfg, str(workdir)), workdir


@pytest.mark.parametrize(
    "name,loss",
    [
        ("coda_prompt", "aepg"),
        ("l2p", "ce"),
        ("dualprompt", "aepg"),
        pytest.param("coda_prompt", "ce", marks=pytest.mark.slow),
        pytest.param("l2p", "aepg", marks=pytest.mark.slow),
        pytest.param("dualprompt", "ce", marks=pytest.mark.slow),
    ],
)
def test_runs_end_to_end(tmp_path, name, loss):
    """From the driver with a LoRA model config: the method drops the LoRA, trains only its
    prompts and the heads, and evaluates with its own predictor."""
    results, workdir = _run(tmp_path, name, **{"loss.name": loss})
    matrix = np.array(results["accuracy_matrix"], float)
    assert matrix.shape == (2, 2) and np.all(np.isfinite(matrix[np.triu_indices(2)]))
    assert results["predictors"] == ["model"]
    train = [r for r in _read_jsonl(workdir / "metrics.jsonl") if r["type"] == "train"]
    assert all(np.isfinite(r["loss"]) for r in train)
    assert next(r["train_peft"] for r in train if r["task"] == 1) is False  # head-only phase
    saved = json.load(open(workdir / "results.json"))
    assert saved["config"]["method"]["name"] == name


@pytest.mark.slow
def test_resume_mid_task_matches_an_uninterrupted_run(tmp_path):
    """DualPrompt (whose begin_task copies a slot) resumed from a checkpoint inside task 1."""
    overrides = {"checkpoint_every_steps": 2, "loss.name": "aepg"}
    full, workdir = _run(tmp_path, "dualprompt", **overrides)
    for step in ("8",):  # drop task 1's final checkpoint: resume from its step-6 one
        shutil.rmtree(workdir / "checkpoints" / step)
    (workdir / records.RESULTS_FILE).unlink()
    resumed, _ = _run(tmp_path, "dualprompt", **overrides)
    assert resumed["accuracy_matrix"] == full["accuracy_matrix"]


@pytest.mark.slow
def test_two_vmapped_seeds_equal_two_single_runs(tmp_path):
    overrides = {"seed": 5, "log_every_steps": 1, "loss.name": "aepg"}
    summary, vmapped = _run(tmp_path, "coda_prompt", "v", num_seeds=2, **overrides)
    assert summary["seeds"] == [5, 6]
    for seed in (5, 6):
        single, single_dir = _run(
            tmp_path, "coda_prompt", f"s{seed}", **{**overrides, "seed": seed}
        )
        seed_dir = vmapped / f"seed_{seed}"
        per_seed = json.load(open(seed_dir / records.RESULTS_FILE))
        _assert_same_run(seed_dir, single_dir, per_seed, single)


# -- configs ----------------------------------------------------------------------------------


def _imagenet_r(arg):
    c = schema.from_file("configs/imagenet_r.py", arg)
    c.model.checkpoint = layout_npz.paper_layout()
    schema.validate(c)
    return c


def test_imagenet_r_rows_take_each_methods_reference_settings_or_the_common_ones():
    o = _imagenet_r("method=coda_prompt,tasks=10").optim
    assert (o.learning_rate, o.batch_size, o.epochs, o.peft_freeze_epochs) == (1e-3, 128, 50, 0)
    assert (o.lr_schedule, o.clip_norm) == ("cosine_epochs", 0.0)
    assert _imagenet_r("method=l2p").optim.to_dict() == o.to_dict()
    c = _imagenet_r("method=dualprompt,tasks=20,loss=aepg")
    assert (c.optim.learning_rate, c.optim.batch_size) == (0.005 * 24 / 256, 24)
    assert (c.optim.lr_schedule, c.optim.clip_norm, c.optim.peft_freeze_epochs) == (
        "constant",
        1.0,
        0,
    )
    assert c.method.dualprompt_pool_size == 20 and c.loss.name == "aepg"
    assert c.model.peft.kind == "none"
    common = _imagenet_r("method=coda_prompt,settings=common").optim
    lae = _imagenet_r("method=lae").optim
    assert common.to_dict() == lae.to_dict()
    assert (common.learning_rate, common.batch_size, common.peft_freeze_epochs) == (5e-4, 256, 30)
    with pytest.raises(ValueError, match="settings='nope' is unknown"):
        _imagenet_r("settings=nope")
