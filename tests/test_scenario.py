"""The domain-incremental scenario (`data.scenario=domain`, docs/algorithm.md §17): the split
(one task per domain, every class, one head), the offline `digits_domains` dataset, the
validation lines, one train step of every method that runs in it, and short runs."""

import json

import jax
import numpy as np
import pytest
import sklearn.datasets
import test_prepare
from tiny import tiny_config

from aepg_jax import methods
from aepg_jax.config import schema
from aepg_jax.continual import programs, setup, trainer
from aepg_jax.data import datasets, embedded, source, splits
from aepg_jax.methods.base import TaskSpec
from aepg_jax.models import head
from aepg_jax.plan import shapes

offline = test_prepare.offline  # no network, no TensorFlow (the prepared-dataset test)
DOMAIN = {"data.source": "digits_domains", "data.scenario": "domain", "data.num_tasks": 4}
ALLOWED = ("plain", "lae", "lwf", "l2p", "dualprompt", "coda_prompt")
REFUSED = ("inflora",)


def domain_config(tmp_path, method="plain", **overrides):
    """The tiny config learning `digits_domains` domain by domain with `method`."""
    extra = {}
    if not methods.get(method).uses_model_peft:
        extra["model.peft.kind"] = "none"
    if method == "dualprompt":  # the tiny ViT has 2 blocks
        extra.update({"method.dualprompt_g_blocks": (0,), "method.dualprompt_e_blocks": (1,)})
    return tiny_config(
        tmp_path / "cache", **{**DOMAIN, "method.name": method, **extra, **overrides}
    )


def _toy(seed=0):
    """Labels over 5 classes and domain ids over 3 domains, every pair present."""
    rng = np.random.default_rng(seed)
    train = np.repeat(np.arange(5), 12)
    return train, np.repeat(np.arange(5), 4), rng.integers(0, 3, 60), rng.integers(0, 3, 20)


# -- the split -----------------------------------------------------------------------------


@pytest.mark.parametrize("order_seed", [None, 4])
def test_domain_split_is_one_task_per_domain_over_every_class(order_seed):
    train, test, train_dom, test_dom = _toy()
    names = ("a", "b", "c")
    split = splits.make_domain_incremental(
        train, test, train_dom, test_dom, 5, names, class_order_seed=order_seed
    )
    assert split.scenario == "domain" and split.num_tasks == 3
    assert split.head_sizes == (5,)  # one head over every class
    for t, task in enumerate(split.tasks):
        assert (task.index, task.offset, task.num_classes, task.domain) == (t, 0, 5, names[t])
        np.testing.assert_array_equal(task.train_indices, np.flatnonzero(train_dom == t))
        np.testing.assert_array_equal(task.test_indices, np.flatnonzero(test_dom == t))
        np.testing.assert_array_equal(task.original_classes, split.class_order)
    # Relabelling only renames classes: the position of the original class in the order.
    position = np.argsort(split.class_order)
    np.testing.assert_array_equal(split.train_labels, position[train])
    np.testing.assert_array_equal(split.test_labels, position[test])
    if order_seed is None:
        np.testing.assert_array_equal(split.train_labels, train)


def test_domain_split_label_noise_draws_other_classes_of_all():
    train, test, train_dom, test_dom = _toy()
    train = np.tile(train, 50)
    train_dom = np.tile(train_dom, 50)
    split = splits.make_domain_incremental(
        train, test, train_dom, test_dom, 5, ("a", "b", "c"), label_noise=0.4, noise_seed=3
    )
    flipped = split.train_labels != split.clean_train_labels
    assert split.realised_noise_rate == pytest.approx(flipped.mean())
    assert 0.35 < split.realised_noise_rate < 0.45
    # A flipped label is another class, and every other class is drawn (not just neighbours).
    moved = split.train_labels[flipped] - split.clean_train_labels[flipped]
    assert set(np.unique(moved % 5)) == {1, 2, 3, 4}
    np.testing.assert_array_equal(split.test_labels, test)  # test labels stay clean


def test_domain_split_refuses_ids_outside_the_domains():
    train, test, train_dom, test_dom = _toy()
    with pytest.raises(ValueError, match=r"train domain ids are not all in \[0, 2\)"):
        splits.make_domain_incremental(train, test, train_dom, test_dom, 5, ("a", "b"))


def test_class_split_keeps_one_head_per_task():
    labels = np.repeat(np.arange(6), 3)
    split = splits.make_class_incremental(labels, labels, 6, 3)
    assert split.scenario == "class" and split.head_sizes == (2, 2, 2) and split.num_tasks == 3
    assert all(t.domain is None for t in split.tasks)


def test_learned_before_is_the_offset_or_every_class_after_the_first_domain():
    cls = TaskSpec(index=2, offset=8, num_classes=4, freeze_steps=0, head_sizes=(4, 4, 4))
    assert cls.learned_before == 8
    for index, want in ((0, 0), (1, 10), (3, 10)):
        dom = TaskSpec(index, 0, 10, 0, (10,), scenario="domain")
        assert int(dom.learned_before) == want
        assert int(dom.traced().learned_before) == want
        assert bool(dom.seen_mask(10).all())  # every class is seen from the first domain on


# -- the dataset ---------------------------------------------------------------------------


def test_digits_domains_are_disjoint_transforms_of_the_digits():
    ds = datasets.load_dataset("digits_domains", split_seed=0)
    assert ds.domain_names == embedded.DIGIT_DOMAINS
    digits = sklearn.datasets.load_digits()
    originals = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    assert len(ds.train) + len(ds.test) == len(originals)  # each digit in one domain, once
    known = {img.tobytes(): label for img, label in zip(originals, digits.target, strict=True)}
    for split in (ds.train, ds.test):
        domains = source.domains_of(split)
        assert set(np.unique(domains)) == {0, 1, 2, 3}
        for d in range(4):
            rows = np.flatnonzero(domains == d)
            assert set(split.labels[rows]) == set(range(10))  # every class in every domain
        for i in np.flatnonzero(domains == 0)[:20]:  # original: a digit as it is
            assert known[split.image(i)[..., 0].tobytes()] == split.labels[i]
        for i in np.flatnonzero(domains == 1)[:20]:  # inverted
            assert known[(255 - split.image(i)[..., 0]).tobytes()] == split.labels[i]
        for i in np.flatnonzero(domains == 2)[:20]:  # rotated back by 90 degrees
            assert known[np.rot90(split.image(i)[..., 0], k=-1).tobytes()] == split.labels[i]
        noisy = [split.image(i)[..., 0].tobytes() for i in np.flatnonzero(domains == 3)[:20]]
        assert not any(img in known for img in noisy)


def test_digits_domains_split_seed_moves_the_split_not_the_domains():
    a, b = (datasets.load_dataset("digits_domains", split_seed=s) for s in (0, 1))
    count = [np.bincount(source.domains_of(ds.train), minlength=4) for ds in (a, b)]
    np.testing.assert_array_equal(count[0], count[1])
    assert not np.array_equal(a.train.labels, b.train.labels)


# -- validation: one line naming the field ---------------------------------------------------


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_domain_scenario_on_a_one_domain_dataset_is_refused_in_one_line(tmp_path):
    cfg = tiny_config(tmp_path / "cache", **{"data.scenario": "domain"})  # digits: one domain
    with pytest.raises(ValueError) as err:
        setup.prepare_data(cfg)
    line = _one_line(err)
    assert "data.scenario=domain" in line and "digits" in line and "data.scenario=class" in line


def test_num_tasks_other_than_the_domains_is_refused_in_one_line(tmp_path):
    cfg = domain_config(tmp_path, **{"data.num_tasks": 3})
    with pytest.raises(ValueError) as err:
        setup.prepare_data(cfg)
    line = _one_line(err)
    assert "data.num_tasks=3" in line and "4 domains" in line and "data.num_tasks=4" in line
    with pytest.raises(ValueError, match=r"data.num_tasks=5 .* set data.num_tasks=4"):
        shapes.run_data(domain_config(tmp_path, **{"data.num_tasks": 5}))


@pytest.mark.parametrize("method", REFUSED)
def test_refused_method_is_refused_in_one_line(tmp_path, method):
    cfg = domain_config(tmp_path, method)
    with pytest.raises(ValueError) as err:
        schema.validate(cfg)
    line = _one_line(err)
    assert f"method.name={method}" in line and "data.scenario=domain" in line
    schema.validate(domain_config(tmp_path, method, **{"data.scenario": "class"}))


@pytest.mark.parametrize("method", ALLOWED)
def test_allowed_method_validates(tmp_path, method):
    schema.validate(domain_config(tmp_path, method))


# -- the steps ---------------------------------------------------------------------------------


# plain and LAE stay in the fast suite; the other methods' steps (~4 s each) run with -m slow.
@pytest.mark.parametrize(
    "method",
    [m if m in ("plain", "lae") else pytest.param(m, marks=pytest.mark.slow) for m in ALLOWED],
)
def test_train_step_runs_in_the_domain_scenario(tmp_path, method):
    """One step of task 0, then one of task 1 (the old-task paths: LwF's distillation, LAE's
    EMA, DualPrompt's slot copy), with one head over the 10 classes."""
    cfg = domain_config(tmp_path, method, **{"optim.peft_freeze_epochs": 0})  # one branch
    run = setup.build(cfg, str(tmp_path / "run"))
    assert run.num_tasks == 4 and run.head_sizes == (10,)
    step = jax.jit(programs.train_step_fn(run))
    state = None
    for t in (0, 1):
        state = trainer.begin_task(run, t, state)
        assert head.head_sizes(state.trainable) == (10,)
        spec = programs.task_spec(run, t)
        assert (spec.offset, spec.num_classes, spec.scenario) == (0, 10, "domain")
        batch = next(programs.train_batches(run, t, epoch=0))
        before = jax.tree.map(np.asarray, state.trainable["head"])
        state, metrics = step(state, run.frozen, batch, *programs.task_args(run, t))
        assert np.isfinite(float(metrics["loss"]))
        if t == 0:  # the whole head trains
            moved = jax.tree.map(
                lambda a, b: np.abs(np.asarray(a) - b).max(), state.trainable["head"], before
            )
            assert all(float(m) > 0 for m in jax.tree.leaves(moved))
        state = trainer.end_task(run, t, state)
    # The evaluation after task 1 scores the 10 classes of domains 0 and 1.
    test = run.data.tasks.tasks[1].test_indices
    assert set(run.data.tasks.test_labels[test]) == set(range(10))


def test_lwf_distils_every_class_from_the_second_domain(tmp_path):
    """LwF's extra term is zero at task 0 and, at task 1, the KL over all 10 classes between
    the model and its copy (positive once the copy is moved away)."""
    run = setup.build(domain_config(tmp_path, "lwf"), str(tmp_path / "run"))
    state = trainer.begin_task(run, 0, None)
    batch = next(programs.train_batches(run, 0, epoch=0))
    images = batch["image"].astype(np.float32) / 127.5 - 1.0
    tree = jax.tree.map(np.asarray, state.trainable)
    copy = jax.tree.map(lambda x: x + 0.05, tree)  # a different "previous model"
    forward = jax.jit(
        lambda spec: run.method.forward(run.net, tree, run.frozen, copy, images, spec)
    )
    extras = [float(forward(programs.task_spec(run, t).traced())[1]) for t in (0, 1)]
    assert extras[0] == 0.0 and extras[1] > 0.0


# -- short runs --------------------------------------------------------------------------------


def _check_results(results, workdir, num_domains=4):
    """Each predictor's accuracy matrix is domains x domains, a[i, j] (domain i after domain
    j) filled for i <= j, each entry over domain i's whole test set; A_T is the last column's
    mean. Returns the primary predictor's matrix."""
    saved = json.load(open(workdir / "results.json"))
    assert saved["A_T"] == pytest.approx(results["A_T"])
    assert saved["num_tasks"] == num_domains and saved["head_sizes"] == [10]
    ds = datasets.load_dataset("digits_domains", split_seed=0)
    per_domain = np.bincount(source.domains_of(ds.test), minlength=num_domains)
    for p in saved["predictors"]:
        matrix = np.array(saved["methods"][p]["accuracy_matrix"], dtype=float)
        assert matrix.shape == (num_domains, num_domains)
        totals = saved["tracker"]["total"][p]
        for i in range(num_domains):
            for j in range(num_domains):
                if i <= j:
                    assert 0.0 <= matrix[i, j] <= 100.0
                    assert totals[i][j] == per_domain[i]  # domain i's test set, all of it
                else:
                    assert np.isnan(matrix[i, j]) and totals[i][j] is None
        assert saved["methods"][p]["A_T"] == pytest.approx(np.mean(matrix[:, -1]))
    primary = np.array(saved["accuracy_matrix"], dtype=float)
    np.testing.assert_array_equal(
        primary, np.array(saved["methods"][saved["predictors"][0]]["accuracy_matrix"], float)
    )
    return primary


@pytest.mark.parametrize("method", ["plain", "lae"])
def test_short_domain_run_gives_a_domains_by_domains_matrix(tmp_path, method):
    """plain + LoRA and LAE + LoRA, a few steps per domain; every predictor's matrix."""
    cfg = domain_config(tmp_path, method, **{"max_steps_per_task": 4})
    results = trainer.run(cfg, str(tmp_path / "run"))
    _check_results(results, tmp_path / "run")
    assert set(results["methods"]) == set(methods.get(method).predictors)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["plain", "lae"])
def test_domain_run_learns_above_chance(tmp_path, method):
    """With 24 steps per domain the first domain is learned well above chance (10 classes)."""
    cfg = domain_config(
        tmp_path,
        method,
        **{"max_steps_per_task": 24, "optim.peft_freeze_epochs": 0, "loss.name": "ce"},
    )
    results = trainer.run(cfg, str(tmp_path / "run"))
    matrix = _check_results(results, tmp_path / "run")
    assert matrix[0, 0] > 20.0
    assert np.nanmean(np.diag(matrix)) > 12.0


@pytest.mark.usefixtures("offline")
def test_a_prepared_six_domain_tfds_dataset_splits_one_task_per_domain(tmp_path):
    """The same interface on a prepared multi-domain TFDS dataset (a tiny fake DomainNet
    release: 6 domains, 345 classes): one task per domain in its order, one 345-class head."""
    import fake_archives

    from aepg_jax.prepare import __main__ as prepare_main

    src = tmp_path / "src"
    src.mkdir()
    fake_archives.make_domainnet(src)
    data_dir = tmp_path / "data"
    assert prepare_main.main(["domainnet", f"--source={src}", f"--data_dir={data_dir}"]) == 0
    over = {"data.source": "tfds", "data.name": "domainnet", "data.data_dir": str(data_dir)}
    cfg = domain_config(tmp_path, **over, **{"data.num_tasks": 6})
    data = setup.prepare_data(cfg)
    ds = datasets.load_configured(cfg.data)
    assert data.tasks.num_tasks == 6 and data.tasks.head_sizes == (345,)
    assert [t.domain for t in data.tasks.tasks] == list(ds.domain_names)
    for t, task in enumerate(data.tasks.tasks):
        np.testing.assert_array_equal(task.train_indices, np.flatnonzero(ds.train.domains == t))
        np.testing.assert_array_equal(task.test_indices, np.flatnonzero(ds.test.domains == t))
    cfg.data.num_tasks = 5
    with pytest.raises(ValueError, match=r"has 6 domains \(clipart, .*set data.num_tasks=6\.$"):
        setup.prepare_data(cfg)


# -- the plan ----------------------------------------------------------------------------------


def test_plan_splits_by_the_shipped_domains(tmp_path):
    from aepg_jax.plan import project

    cfg = domain_config(tmp_path)
    data = shapes.run_data(cfg)
    ds = datasets.load_dataset("digits_domains", split_seed=0)
    assert data.tasks.head_sizes == (10,) and data.tasks.num_tasks == 4
    for t, task in enumerate(data.tasks.tasks):
        np.testing.assert_array_equal(task.train_indices, np.flatnonzero(ds.train.domains == t))
    run = shapes.shape_run(cfg)
    assert run.head_sizes == (10,)
    calls = project.calls(run)
    test_sizes = np.bincount(ds.test.domains)
    per_domain = [-(-int(n) // cfg.eval.batch_size) for n in test_sizes]  # padded batches
    assert calls["eval after task 4"] == sum(p * (4 - i) for i, p in enumerate(per_domain))


def test_plan_of_a_sized_dataset_assumes_equal_domains_with_every_class(tmp_path):
    cfg = domain_config(tmp_path, **{"data.source": "tfds", "data.name": "cifar100"})
    cfg.data.num_tasks = 5
    data = shapes.run_data(cfg)
    assert data.tasks.head_sizes == (100,)
    assert [len(t.train_indices) for t in data.tasks.tasks] == [10_000] * 5
    for task in data.tasks.tasks:
        assert set(data.tasks.train_labels[task.train_indices]) == set(range(100))
