"""Tests for aepg_jax.data.loader: epochs, eval padding/mask, sharding over 8 CPU devices."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from aepg_jax.data import loader

N = 53


def _data(n=N, size=4):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(n) % 256  # row id readable from the pixels
    return images, rng.integers(0, 10, n)


def test_train_epochs_drop_last_and_are_seeded():
    images, labels = _data()
    mesh = loader.data_mesh()
    indices = np.arange(3, N)  # a task's subset
    batches = list(loader.iterate(images, labels, indices, 8, mesh, train=True, seed=1, epoch=0))
    assert len(batches) == (N - 3) // 8
    seen = np.concatenate([np.asarray(b["image"][:, 0, 0, 0]) for b in batches])
    assert len(set(seen)) == len(seen) and set(seen) <= set(indices)
    for b in batches:
        rows = np.asarray(b["image"][:, 0, 0, 0])
        np.testing.assert_array_equal(np.asarray(b["label"]), labels[rows])
        assert b["image"].dtype == np.uint8 and b["label"].dtype == np.int32
        assert bool(np.all(np.asarray(b["mask"])))

    def order(seed, epoch):
        return np.concatenate(
            [
                np.asarray(b["image"][:, 0, 0, 0])
                for b in loader.iterate(
                    images, labels, indices, 8, mesh, train=True, seed=seed, epoch=epoch
                )
            ]
        )

    np.testing.assert_array_equal(order(1, 0), seen)  # same (seed, epoch): same batches
    assert not np.array_equal(order(1, 1), seen)
    assert not np.array_equal(order(2, 0), seen)


def test_eval_covers_every_example_once_with_mask():
    images, labels = _data()
    indices = np.arange(N)[::-1].copy()
    batches = list(loader.iterate(images, labels, indices, 16, loader.data_mesh(), train=False))
    assert len(batches) == 4  # ceil(53 / 16)
    rows = np.concatenate([np.asarray(b["image"][:, 0, 0, 0]) for b in batches])
    mask = np.concatenate([np.asarray(b["mask"]) for b in batches])
    assert mask.sum() == N and not mask[N:].any()
    np.testing.assert_array_equal(rows[mask], indices)


def test_early_exit_and_bad_batch_size():
    images, labels = _data()
    it = loader.iterate(images, labels, np.arange(N), 4, loader.data_mesh(), train=True)
    next(it)
    it.close()  # the prefetch thread shuts down cleanly
    with pytest.raises(ValueError, match="batch_size=0 must be a positive multiple"):
        next(loader.iterate(images, labels, np.arange(N), 0, loader.data_mesh(), train=True))
    assert loader.num_batches(53, 8, drop_last=True) == 6
    assert loader.num_batches(53, 8, drop_last=False) == 7


SHARDED_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import jax, numpy as np
    from aepg_jax.data import loader
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (53, 4, 4, 3), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(53)
    labels = rng.integers(0, 10, 53)
    mesh = loader.data_mesh()
    out = {"devices": len(jax.devices()), "train": [], "eval": [], "shard_rows": []}
    for b in loader.iterate(images, labels, np.arange(53), 16, mesh, train=True, seed=4):
        out["train"].append(np.asarray(b["image"][:, 0, 0, 0]).tolist())
        out["shard_rows"].append(sorted(s.data.shape[0] for s in b["image"].addressable_shards))
        out["spec"] = list(b["image"].sharding.spec)
        out["n_shards"] = len({s.device for s in b["label"].addressable_shards})
    for b in loader.iterate(images, labels, np.arange(53), 16, mesh, train=False):
        out["eval"].append([np.asarray(b["image"][:, 0, 0, 0]).tolist(),
                            np.asarray(b["mask"]).tolist()])
    try:
        next(loader.iterate(images, labels, np.arange(53), 12, mesh, train=True))
    except ValueError as err:
        out["error"] = str(err)
    print(json.dumps(out))
""")


def _run(devices: int) -> dict:
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        JAX_PLATFORMS="cpu",
    )
    result = subprocess.run(
        [sys.executable, "-c", SHARDED_SCRIPT],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_sharded_over_8_devices_matches_one_device():
    eight, one = _run(8), _run(1)
    assert eight["devices"] == 8 and one["devices"] == 1
    assert eight["spec"] == ["data"] and eight["n_shards"] == 8
    assert all(rows == [2] * 8 for rows in eight["shard_rows"])  # 16 rows / 8 devices
    assert eight["train"] == one["train"] and eight["eval"] == one["eval"]
    assert "multiple of the number of devices (8)" in eight["error"]
    assert jax.device_count() >= 1  # the test process itself is untouched


def test_start_skips_batches_of_the_same_epoch():
    images, labels = _data()
    mesh = loader.data_mesh()

    def rows(start):
        return [
            np.asarray(b["image"][:, 0, 0, 0]).tolist()
            for b in loader.iterate(
                images, labels, np.arange(N), 8, mesh, train=True, seed=5, epoch=2, start=start
            )
        ]

    assert rows(4) == rows(0)[4:]
    assert rows(100) == []


def test_a_seed_list_stacks_each_seeds_own_batches():
    images, labels = _data()
    mesh = loader.data_mesh()
    seeds = [3, 9, 4]

    def run(seed, start=0):
        return list(
            loader.iterate(
                images, labels, np.arange(N), 8, mesh, train=True, seed=seed, epoch=1, start=start
            )
        )

    stacked = run(seeds, start=1)
    singles = [run(s, start=1) for s in seeds]
    assert len(stacked) == len(singles[0]) == N // 8 - 1
    for b, batch in enumerate(stacked):
        assert batch["image"].shape == (3, 8, 4, 4, 3) and batch["label"].shape == (3, 8)
        assert batch["image"].sharding.spec == loader.seeds_batch_sharding(mesh).spec
        for i in range(len(seeds)):
            for key in ("image", "label", "mask"):
                np.testing.assert_array_equal(batch[key][i], singles[i][b][key])
    assert not np.array_equal(stacked[0]["label"][0], stacked[0]["label"][1])
    with pytest.raises(ValueError, match="Evaluation batches take no seeds"):
        next(loader.iterate(images, labels, np.arange(N), 8, mesh, train=False, seed=[1, 2]))


def test_reused_buffers_never_change_a_batch_still_held():
    """Dropped batches free their buffers for reuse; held ones (and views of them) stay intact."""
    images, labels = _data(n=200, size=8)
    mesh = loader.data_mesh()

    def run(**kw):
        return loader.iterate(images, labels, np.arange(200), 8, mesh, train=True, seed=5, **kw)

    held = list(run(workers=1, prefetch=1))
    views = []
    for b, batch in enumerate(run(workers=2, prefetch=3)):  # each batch dropped after its turn
        image = np.asarray(batch["image"])
        np.testing.assert_array_equal(image, held[b]["image"])
        if b % 5 == 0:
            views.append((b, image))  # a host view of a batch keeps its buffer from reuse
    for b, image in views:
        np.testing.assert_array_equal(image, held[b]["image"])
    for b, batch in enumerate(held):
        rows = loader.epoch_order(np.arange(200), 5, 0)[b * 8 : (b + 1) * 8]
        np.testing.assert_array_equal(np.asarray(batch["image"]), images[rows])
        np.testing.assert_array_equal(np.asarray(batch["label"]), labels[rows])
