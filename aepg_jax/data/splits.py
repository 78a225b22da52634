"""Task splits of the two scenarios: class-incremental (docs/algorithm.md §4) and
domain-incremental (docs/algorithm.md §17).

Class-incremental (`make_class_incremental`): classes are ordered (identity, or a permutation
drawn from `class_order_seed` by `class_order_rng`), relabelled by their position in that
order, and cut into `num_tasks` consecutive groups with `np.array_split` (uneven counts put the
extra classes first: Food-101's 101 classes in 10 tasks give 11, 10, ..., 10). Task t owns the
relabelled classes `[offset_t, offset_t + size_t)`; during its training the loss sees
`logits[:, offset_t:offset_t + size_t]` and labels `y - offset_t`. The domains of a
multi-domain dataset are mixed in every task.

Domain-incremental (`make_domain_incremental`): task t is every example of domain t (the
dataset's domain order); every task has offset 0 and all C classes (relabelled by the class
order as above, which only renames them), so the loss sees every class's logits with the
labels as they are (no offset), the model has one head over all C classes, and evaluation
after task t covers the test sets of domains 0..t.

Both give a `TaskSplit`, the object the trainer consumes; its `head_sizes` are the model's
heads (one per task of new classes, or one over every class).

Symmetric label noise (`label_noise = eta`): each training example's label is, with
probability eta, replaced by a uniformly drawn *other* class of the same task; drawn once from
`noise_seed`, so fixed per seed. Test labels stay clean. The realised rate is reported.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Task:
    """One task: its relabelled class range and the example indices of each split."""

    index: int
    offset: int  # first relabelled class of the task
    num_classes: int
    original_classes: np.ndarray  # the dataset's label ids of the task's classes, in order
    train_indices: np.ndarray  # into the dataset's train split
    test_indices: np.ndarray  # into the dataset's test split
    domain: str | None = None  # the task's domain (domain scenario); None: class scenario

    @property
    def stop(self) -> int:
        """One past the task's last relabelled class."""
        return self.offset + self.num_classes


SCENARIOS = ("class", "domain")


@dataclasses.dataclass(frozen=True)
class TaskSplit:
    """A dataset cut into tasks, with relabelled (and possibly noisy) labels."""

    class_order: np.ndarray  # original label at each position
    tasks: tuple[Task, ...]
    train_labels: np.ndarray  # relabelled training labels, noisy when label_noise > 0
    test_labels: np.ndarray  # relabelled clean test labels
    clean_train_labels: np.ndarray
    realised_noise_rate: float
    scenario: str = "class"  # class: each task new classes | domain: each task one domain

    @property
    def num_classes(self) -> int:
        return len(self.class_order)

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    @property
    def head_sizes(self) -> tuple[int, ...]:
        """The model's heads: the classes of each task in task order (class scenario), or one
        head over every class (domain scenario, where every task has them all)."""
        if self.scenario == "domain":
            return (self.num_classes,)
        return tuple(t.num_classes for t in self.tasks)


CLASS_ORDER_RNGS = ("default", "numpy_legacy")


def class_order(num_classes: int, seed: int | None = None, rng: str = "default") -> np.ndarray:
    """Identity order, or a permutation of `range(num_classes)` drawn from `seed` by `rng`.

    default: `np.random.default_rng(seed).permutation(n)` (PCG64). numpy_legacy: numpy's
    Mersenne Twister, `np.random.seed(seed); np.random.permutation(n)` as PyCIL and PILOT draw
    it (seed 1993 gives their published order), from a local `RandomState(seed)`: the same
    stream, with numpy's global state left alone.
    """
    if rng not in CLASS_ORDER_RNGS:
        raise ValueError(f"class_order_rng={rng!r} is unknown; use one of {CLASS_ORDER_RNGS}.")
    if seed is None:
        return np.arange(num_classes)
    if rng == "numpy_legacy":
        return np.random.RandomState(seed).permutation(num_classes)
    return np.random.default_rng(seed).permutation(num_classes)


def symmetric_label_noise(
    labels: np.ndarray, tasks: tuple[Task, ...], rate: float, seed: int
) -> np.ndarray:
    """Each label -> a uniform *other* class of its task with probability `rate`.

    Classes of single-class tasks are never changed (there is no other class to draw).
    """
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"label_noise must be in [0, 1); got {rate}.")
    rng = np.random.default_rng(seed)
    noisy = labels.copy()
    flip = rng.random(len(labels)) < rate
    # Relabelled class c lies in task t when offset_t <= c < stop_t (domain tasks all share
    # [0, C): the first one's range is every task's).
    stops = np.array([t.stop for t in tasks])
    task_of = np.searchsorted(stops, labels, side="right")
    offsets = np.array([t.offset for t in tasks])[task_of]
    sizes = np.array([t.num_classes for t in tasks])[task_of]
    flip &= sizes > 1
    # A uniform draw from the size - 1 other classes: shift by 1 + U{0, size - 2} modulo size.
    shift = 1 + np.floor(rng.random(len(labels)) * np.maximum(sizes - 1, 1)).astype(np.int64)
    moved = offsets + (labels - offsets + shift) % sizes
    noisy[flip] = moved[flip]
    return noisy


def _relabel(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
    seed: int | None,
    rng: str = "default",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(class order, train, test)`: labels checked in `[0, num_classes)` and replaced by
    their class's position in the order."""
    for name, labels in (("train", train_labels), ("test", test_labels)):
        if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(f"{name} labels are not all in [0, {num_classes}).")
    order = class_order(num_classes, seed, rng)
    position = np.empty(num_classes, np.int64)
    position[order] = np.arange(num_classes)
    train = position[np.asarray(train_labels, np.int64)]
    test = position[np.asarray(test_labels, np.int64)]
    return order, train, test


def _with_noise(
    order: np.ndarray,
    tasks: tuple[Task, ...],
    train: np.ndarray,
    test: np.ndarray,
    label_noise: float,
    noise_seed: int,
    scenario: str,
) -> TaskSplit:
    """The `TaskSplit` of `tasks`, its training labels made noisy within each task's classes."""
    noisy = symmetric_label_noise(train, tasks, label_noise, noise_seed) if label_noise else train
    rate = float(np.mean(noisy != train)) if len(train) else 0.0
    return TaskSplit(order, tasks, noisy, test, train, rate, scenario)


def make_class_incremental(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
    num_tasks: int,
    *,
    class_order_seed: int | None = None,
    class_order_rng: str = "default",
    label_noise: float = 0.0,
    noise_seed: int = 0,
) -> TaskSplit:
    """Cuts a dataset with original labels in `[0, num_classes)` into `num_tasks` tasks."""
    if not 1 <= num_tasks <= num_classes:
        raise ValueError(
            f"num_tasks={num_tasks} must be between 1 and the number of classes ({num_classes})."
        )
    order, train, test = _relabel(
        train_labels, test_labels, num_classes, class_order_seed, class_order_rng
    )

    tasks, offset = [], 0
    for t, group in enumerate(np.array_split(np.arange(num_classes), num_tasks)):
        stop = offset + len(group)
        tasks.append(
            Task(
                index=t,
                offset=offset,
                num_classes=len(group),
                original_classes=order[group],
                train_indices=np.flatnonzero((train >= offset) & (train < stop)),
                test_indices=np.flatnonzero((test >= offset) & (test < stop)),
            )
        )
        offset = stop
    return _with_noise(order, tuple(tasks), train, test, label_noise, noise_seed, "class")


def make_domain_incremental(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    train_domains: np.ndarray,
    test_domains: np.ndarray,
    num_classes: int,
    domain_names: tuple[str, ...],
    *,
    class_order_seed: int | None = None,
    class_order_rng: str = "default",
    label_noise: float = 0.0,
    noise_seed: int = 0,
) -> TaskSplit:
    """One task per domain, in the order of `domain_names`: task t holds the examples whose
    domain id is t, over every class (offset 0, `num_classes` classes)."""
    if not domain_names:
        raise ValueError("A domain-incremental split needs at least one domain.")
    for name, labels, domains in (
        ("train", train_labels, train_domains),
        ("test", test_labels, test_domains),
    ):
        if len(domains) != len(labels):
            raise ValueError(f"{name}: {len(domains)} domain ids for {len(labels)} labels.")
        if len(domains) and (domains.min() < 0 or domains.max() >= len(domain_names)):
            raise ValueError(f"{name} domain ids are not all in [0, {len(domain_names)}).")
    order, train, test = _relabel(
        train_labels, test_labels, num_classes, class_order_seed, class_order_rng
    )
    tasks = tuple(
        Task(
            index=t,
            offset=0,
            num_classes=num_classes,
            original_classes=order,
            train_indices=np.flatnonzero(np.asarray(train_domains) == t),
            test_indices=np.flatnonzero(np.asarray(test_domains) == t),
            domain=name,
        )
        for t, name in enumerate(domain_names)
    )
    return _with_noise(order, tasks, train, test, label_noise, noise_seed, "domain")
