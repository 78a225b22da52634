"""Tests for aepg_jax.data.splits: class-incremental tasks and symmetric label noise."""

import numpy as np
import pytest

from aepg_jax.data import splits


def _labels(num_classes, per_class, seed=0):
    labels = np.repeat(np.arange(num_classes), per_class)
    return np.random.default_rng(seed).permutation(labels)


def test_food101_shape_split():
    """101 classes in 10 tasks: np.array_split gives 11 classes to the first task."""
    train, test = _labels(101, 6), _labels(101, 2, seed=1)
    ci = splits.make_class_incremental(train, test, 101, 10)
    assert ci.head_sizes == (11,) + (10,) * 9
    assert [t.offset for t in ci.tasks] == [0, 11, 21, 31, 41, 51, 61, 71, 81, 91]
    assert ci.tasks[-1].stop == 101


@pytest.mark.parametrize("seed", [None, 3])
def test_tasks_are_disjoint_and_complete(seed):
    train, test = _labels(20, 5), _labels(20, 3, seed=2)
    ci = splits.make_class_incremental(train, test, 20, 4, class_order_seed=seed)
    all_train = np.concatenate([t.train_indices for t in ci.tasks])
    all_test = np.concatenate([t.test_indices for t in ci.tasks])
    assert sorted(all_train) == list(range(len(train)))
    assert sorted(all_test) == list(range(len(test)))
    classes = np.concatenate([t.original_classes for t in ci.tasks])
    np.testing.assert_array_equal(classes, ci.class_order)
    assert sorted(classes) == list(range(20))
    for task in ci.tasks:
        # Relabelled labels of a task's examples lie in its range and come from its classes.
        assert np.all(
            (ci.train_labels[task.train_indices] >= task.offset)
            & (ci.train_labels[task.train_indices] < task.stop)
        )
        assert set(train[task.train_indices]) == set(task.original_classes)
        assert set(test[task.test_indices]) == set(task.original_classes)
    # Relabelled label = position of the original class in the class order.
    position = np.argsort(ci.class_order)
    np.testing.assert_array_equal(ci.test_labels, position[test])
    np.testing.assert_array_equal(ci.train_labels, position[train])


def test_relabelling_follows_the_class_order():
    train = np.array([0, 1, 2, 3, 4, 5])
    ci = splits.make_class_incremental(train, train, 6, 3, class_order_seed=7)
    order = ci.class_order
    assert sorted(order) == list(range(6)) and not np.array_equal(order, np.arange(6))
    for position, original in enumerate(order):
        assert ci.train_labels[train == original][0] == position
    identity = splits.make_class_incremental(train, train, 6, 3)
    np.testing.assert_array_equal(identity.train_labels, train)
    np.testing.assert_array_equal(
        splits.class_order(6, 7),
        splits.make_class_incremental(train, train, 6, 2, class_order_seed=7).class_order,
    )


def test_label_noise_rate_within_task_and_fixed_per_seed():
    train, test = _labels(10, 2000), _labels(10, 10)
    ci = splits.make_class_incremental(train, test, 10, 5, label_noise=0.2, noise_seed=1)
    assert abs(ci.realised_noise_rate - 0.2) < 0.01
    changed = ci.train_labels != ci.clean_train_labels
    assert abs(changed.mean() - ci.realised_noise_rate) < 1e-12
    for task in ci.tasks:
        noisy = ci.train_labels[task.train_indices]
        assert np.all((noisy >= task.offset) & (noisy < task.stop))  # never leaves its task
    np.testing.assert_array_equal(
        ci.test_labels, splits.make_class_incremental(train, test, 10, 5).test_labels
    )  # test labels stay clean
    again = splits.make_class_incremental(train, test, 10, 5, label_noise=0.2, noise_seed=1)
    np.testing.assert_array_equal(again.train_labels, ci.train_labels)
    other = splits.make_class_incremental(train, test, 10, 5, label_noise=0.2, noise_seed=2)
    assert not np.array_equal(other.train_labels, ci.train_labels)


def test_label_noise_draws_other_classes_uniformly():
    train = np.zeros(30000, np.int64)  # every example is class 0 of a 4-class task
    ci = splits.make_class_incremental(train, train[:4], 4, 1, label_noise=0.6, noise_seed=0)
    counts = np.bincount(ci.train_labels, minlength=4) / len(train)
    assert abs(counts[0] - 0.4) < 0.01
    np.testing.assert_allclose(counts[1:], 0.2, atol=0.01)


def test_single_class_tasks_are_never_noisy():
    train = _labels(3, 100)
    ci = splits.make_class_incremental(train, train, 3, 3, label_noise=0.5)
    np.testing.assert_array_equal(ci.train_labels, ci.clean_train_labels)
    assert ci.realised_noise_rate == 0.0


def test_errors():
    labels = np.arange(5)
    with pytest.raises(ValueError, match="num_tasks=6 must be between 1 and the number of classes"):
        splits.make_class_incremental(labels, labels, 5, 6)
    with pytest.raises(ValueError, match=r"train labels are not all in \[0, 4\)"):
        splits.make_class_incremental(labels, labels[:4], 4, 2)
    with pytest.raises(ValueError, match=r"label_noise must be in \[0, 1\)"):
        splits.make_class_incremental(labels, labels, 5, 1, label_noise=1.0)


def test_a_task_without_test_examples_is_refused_in_one_line():
    from aepg_jax.continual import setup

    train = np.arange(4).repeat(3)
    test = np.array([0, 1, 1, 0])  # classes 2 and 3 have no test examples
    tasks = splits.make_class_incremental(train, test, 4, 2)
    with pytest.raises(ValueError, match=r"task 2 of toy .*has no test examples") as err:
        setup._require_examples("toy", tasks, 2)
    assert "\n" not in str(err.value)
    setup._require_examples("toy", splits.make_class_incremental(train, train, 4, 2), 2)


# The class order PILOT's data manager logs for seed 1993, as printed in the published logs of
# github.com/zhoudw-zdw/RevisitingCIL (logs/simplecil/{imageneta,objectnet}: 200 classes;
# logs/simplecil/omnibenchmark: 300 classes), which share that data manager.
PILOT_ORDER_1993 = {
    200: [168, 136, 51, 9, 183, 101, 171, 99, 42, 159, 191, 70, 16, 188, 27, 10, 175, 26],
    300: [169, 221, 146, 296, 92, 229, 49, 70, 126, 77, 243, 57, 120, 223, 27, 217, 154, 8],
}


def _global_seed_permutation(seed, n):
    """PILOT's own code, on numpy's global generator: `np.random.seed(s);
    np.random.permutation(n)`; returns the order and whether `class_order` called in between
    left the global state alone."""
    np.random.seed(12345)  # noqa: NPY002 (the legacy global API under test)
    before = np.random.get_state()  # noqa: NPY002
    splits.class_order(n, seed, "numpy_legacy")
    untouched = all(
        np.array_equal(a, b)
        for a, b in zip(before[1:3], np.random.get_state()[1:3], strict=True)  # noqa: NPY002
    )
    np.random.seed(seed)  # noqa: NPY002
    return np.random.permutation(n), untouched  # noqa: NPY002


@pytest.mark.parametrize("n", [7, 50, 200, 300])
@pytest.mark.parametrize("seed", [0, 1993])
def test_numpy_legacy_order_is_the_global_seed_permutation(n, seed):
    """numpy_legacy = `np.random.seed(s); np.random.permutation(n)`, global state untouched."""
    pilot, untouched = _global_seed_permutation(seed, n)
    ours = splits.class_order(n, seed, "numpy_legacy")
    assert untouched
    np.testing.assert_array_equal(ours, pilot)
    if seed == 1993 and n in PILOT_ORDER_1993:
        assert ours[: len(PILOT_ORDER_1993[n])].tolist() == PILOT_ORDER_1993[n]


def test_class_order_rng_default_is_unchanged_and_unknown_refused():
    np.testing.assert_array_equal(
        splits.class_order(200, 1993), np.random.default_rng(1993).permutation(200)
    )
    assert not np.array_equal(
        splits.class_order(200, 1993), splits.class_order(200, 1993, "numpy_legacy")
    )
    np.testing.assert_array_equal(splits.class_order(5, None, "numpy_legacy"), np.arange(5))
    with pytest.raises(ValueError, match="numpy_legacy"):
        splits.class_order(5, 1, "mt")


def test_numpy_legacy_relabels_as_pilot_maps_its_targets():
    """PILOT: `order = np.random.permutation(n).tolist()`, new label = `order.index(y)`."""
    train, test = _labels(200, 2), _labels(200, 1, seed=4)
    ci = splits.make_class_incremental(
        train, test, 200, 10, class_order_seed=1993, class_order_rng="numpy_legacy"
    )
    order = _global_seed_permutation(1993, 200)[0].tolist()
    np.testing.assert_array_equal(ci.train_labels, [order.index(y) for y in train])
    np.testing.assert_array_equal(ci.test_labels, [order.index(y) for y in test])
    assert ci.tasks[0].original_classes.tolist() == order[:20]
    assert ci.head_sizes == (20,) * 10
