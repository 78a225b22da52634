"""The continual-method interface and plain fine-tuning, whose behaviour is its default.

A method is a `Method` subclass: class attributes (name, predictors, config defaults) and hooks,
called by the task loop at fixed points. Its own state (`method_state`, any pytree of arrays,
`{}` for plain) is carried in the `TrainState`, checkpointed and vmapped over seeds with it.

Host side, once per task (outside jit, one seed at a time; `grow` and `init_state` are traced
into one jitted program over every seed unless `grows_on_host`):
    begin_task(task, trainable, state, ctx) -> (trainable, state)   before task t's own leaves
    grow(task, trainable, key) -> trainable                         task t's own new leaves
    end_task(task, trainable, state, ctx) -> state                  after training, before eval
    init_state(trainable) -> state                                  the state before task 0
    trains_task(task) -> bool                  False: task t gets no optimizer step (its hooks
                                               and evaluation still run)
The state's shapes hold for the whole run: a checkpoint's is `init_state` of task 0's tree.
Inside the jitted train step (pure):
    forward(net, trainable, frozen, state, images, task) -> (logits, extra_loss | None)
    after_step(trainable, state, task) -> state                     after each optimizer update
Inside the jitted evaluation (pure):
    predict(net, trainable, frozen, state, images, task)
        -> ({predictor: probs (B, C)}, logits (B, C) whose entropy is logged), the classes
           after task `task.index` masked (probability 0, `mask_unseen`)
Planning (`aepg_jax.plan`, shapes only):
    host_programs(trainable, state, frozen, batch, task) -> {name: (fn, args, passes)}
        the method's own jitted programs besides the train and eval steps
Config:
    defaults: {field: value} added to `method.*`;  check(cfg) -> [problems]
    memory_problems(cfg, left, where, seeds) -> [problems]   what cannot fit, before any build
    reference_settings: {"optim.field": value} of the method's reference implementation
    uses_model_peft: whether the method trains the `model.peft` modules
    official_head_init: how its official code's task heads start (`models/head.py` INITS;
        normal unless it says), the init of `method.head_init=official` (the default)
    earlier_head_init(flat): how its heads started in a (flat) config saved before
        `method.head_init` existed (`head_init_before_field`; identity of runs saved then)
Shared pieces: `compiled` (a host hook's jitted program, once per instance), `predictions`
(the predict epilogue), `task_batches` / `task_rows` (a pass over the task's training images),
`on_mesh` (host-made leaves replicated on the run's mesh); the heads' maths is `models/head.py`.
Reports:
    scores: {predictor: why its outputs are scores, not a trained probability model}; their
        calibration (ECE, NLL, test entropy, reliability) is null in results.json with the note
        "scores, not probabilities: <why>" (`calibration_notes`); default: none
    logged_predictor: the predictor whose logits `predict` returns (the first unless said)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from aepg_jax.metrics import SCORES
from aepg_jax.models import partition, vit
from aepg_jax.system import hosts, progress

Params = dict[str, Any]
Batch = dict[str, jax.Array]


@flax.struct.dataclass
class TaskSpec:
    """The task being trained or evaluated. Its integers are Python ints on the host and traced
    int32 scalars inside the compiled programs, which one program serves for every task; the
    head sizes (every task's, the model has all heads from the start) are static."""

    index: Any  # task t, 0-based
    offset: Any  # first class of the task (in the relabelled order)
    num_classes: Any  # classes of the task
    freeze_steps: Any  # head-only steps at the start of the task
    head_sizes: tuple[int, ...] = flax.struct.field(pytree_node=False)  # the model's heads
    # class: each task brings new classes, one head each | domain: every task has every class
    # (offset 0, one head), docs/algorithm.md §17
    scenario: str = flax.struct.field(pytree_node=False, default="class")
    # The task's optimizer steps per epoch: where a per-epoch learning-rate decay stands
    # (`epoch = step // steps_per_epoch`), an argument of the one train program, not a shape.
    steps_per_epoch: Any = 1

    @property
    def stop(self) -> Any:
        """One past the task's last class: classes `[0, stop)` are seen after the task."""
        return self.offset + self.num_classes

    @property
    def learned_before(self) -> Any:
        """Classes `[0, learned_before)` were learned by the tasks before this one: the task's
        offset (class scenario); every class from task 1 on, none at task 0 (domain)."""
        if self.scenario == "domain":
            return jnp.where(jnp.asarray(self.index) > 0, self.stop, 0)
        return self.offset

    def traced(self) -> TaskSpec:
        """The spec with int32 array leaves (a jitted program's argument)."""
        return jax.tree.map(lambda x: jnp.asarray(x, jnp.int32), self)

    def seen_mask(self, num_classes: int) -> jax.Array:
        """(C,) True for the classes of tasks 0..t."""
        return jnp.arange(num_classes) < self.stop


# `method.head_init`'s default: the heads of the method's official code (`official_head_init`).
OFFICIAL_HEAD_INIT = "official"

NEG = -1e30  # the logit of a masked class: softmax gives it probability 0 (exp underflows)


def mask_unseen(logits: jax.Array, task: TaskSpec) -> jax.Array:
    """Logits (B, C) with the classes of tasks after `task.index` set to `NEG`: a softmax, an
    argmax or an entropy over them equals one over the seen classes alone."""
    return jnp.where(task.seen_mask(logits.shape[-1]), logits, jnp.asarray(NEG, logits.dtype))


@dataclasses.dataclass(frozen=True)
class Network:
    """The ViT of the run with any set of task heads; methods compose its forward passes."""

    model_cfg: ml_collections.ConfigDict

    def apply(
        self,
        params: Params,
        images: jax.Array,
        head_sizes: tuple[int, ...],
        prefixes: vit.Prefixes | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """`(logits (B, sum(head_sizes)), {"features": ...})` of the full parameter tree, with
        optional external key/value prefixes per block (see `vit.py`)."""
        model = vit.build(self.model_cfg, tuple(head_sizes))
        return model.apply({"params": params}, images, prefixes=prefixes)


@dataclasses.dataclass(frozen=True)
class TaskContext:
    """What a host-side task hook may use (one seed's view)."""

    net: Network
    frozen: Params  # this seed's frozen backbone leaves
    # The task's training images (uint8, unaugmented) in order, `eval.batch_size` per batch,
    # sharded like evaluation; padding rows have mask False.
    train_batches: Callable[[], Iterator[Batch]]
    # This seed's key for the task's host-side random choices, `fold_in(seed key, 3000 + t)`,
    # drawn when a hook asks for it (`key`): a method without random choices compiles nothing.
    key_of: Callable[[], jax.Array] | None = None

    @property
    def key(self) -> jax.Array:
        if self.key_of is None:
            raise ValueError("This task context has no key.")
        return self.key_of()


def softmax_probs(logits: jax.Array) -> jax.Array:
    """Class probabilities, in float32 whatever the compute dtype."""
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)


def predictions(logits: jax.Array, task: TaskSpec) -> tuple[dict[str, jax.Array], jax.Array]:
    """`predict`'s answer for one predictor, `model`: the softmax of the logits (B, C) with the
    unseen classes masked, and the masked logits."""
    logits = mask_unseen(logits, task)
    return {"model": softmax_probs(logits)}, logits


def on_mesh(tree: Any, like: Any) -> Any:
    """`tree` replicated on the mesh that `like`'s leaves live on (unchanged where they have
    none): host-made leaves (NumPy, fresh zeros) placed as a jitted program's outputs will be,
    so that the program compiles once, and a multi-process checkpoint takes them."""
    sharding = getattr(jax.tree.leaves(like)[0], "sharding", None)
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return tree
    replicated = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return jax.device_put(tree, replicated)


def task_batches(ctx: TaskContext, desc: str) -> Iterator[Batch]:
    """The task's training batches (`ctx.train_batches()`) under process 0's progress bar."""
    yield from progress.new(
        ctx.train_batches(), desc=desc, unit="batch", leave=False, disable=jax.process_index() != 0
    )


def task_rows(
    ctx: TaskContext, fn: Callable[[Batch], jax.Array], desc: str
) -> tuple[np.ndarray, np.ndarray]:
    """`fn(batch)` (B, F) over the task's training batches, in order, with every process's rows
    gathered to the host: the valid rows' outputs (N, F) float32 and labels (N,) int32."""
    out, labels = [], []
    for batch in task_batches(ctx, desc):
        f, y, keep = hosts.gather((fn(batch), batch["label"], batch["mask"]))
        keep = np.asarray(keep).astype(bool)
        out.append(np.asarray(f)[keep])
        labels.append(np.asarray(y)[keep])
    if not out:
        raise ValueError(f"{desc}: the task has no training images.")
    return np.concatenate(out).astype(np.float32), np.concatenate(labels).astype(np.int32)


class Method:
    """Plain fine-tuning: one set of trainable PEFT + head leaves, no extra state or loss."""

    name: ClassVar[str] = "plain"
    predictors: ClassVar[tuple[str, ...]] = ("model",)  # the first is the primary one
    defaults: ClassVar[dict[str, Any]] = {}  # this method's `method.*` config fields
    # The settings of the method's reference implementation, `{"optim.x": value}`, which the
    # paper configs apply with `settings=reference` ({}: the paper's own, Table 5).
    reference_settings: ClassVar[dict[str, Any]] = {}
    uses_model_peft: ClassVar[bool] = True  # False: it ignores `model.peft` (own parameters)
    # True: the trainable tree holds a copy of the whole backbone under `finetuned/` (full
    # fine-tuning; `partition.FINETUNED`), trained at `lr_scales["finetuned"]` times the rate.
    finetunes_backbone: ClassVar[bool] = False
    # `grow` and `init_state` run inside one jitted program (per task, per run) unless the
    # method's `grow` computes on the host (numpy): then it is called as is, per seed.
    grows_on_host: ClassVar[bool] = False
    # Backbone forward passes beyond the model's own, for the sweep's cost estimate
    # (`plan/estimate.py`): per training image, per evaluated image, over each task's data.
    extra_train_forwards: ClassVar[int] = 0
    eval_forwards: ClassVar[int] = 1
    task_data_passes: ClassVar[int] = 0
    # How the method's official code starts its task heads (`models/head.py` INITS): what
    # `method.head_init=official`, the default, gives (docs/algorithm.md §18).
    official_head_init: ClassVar[str] = "normal"
    # The heads of a config saved before `method.head_init` existed, where they started
    # otherwise than `official_head_init` (None: as it): a run saved then resumes
    # (`runs/identity.py`).
    head_init_before_field: ClassVar[str | None] = None
    # Calibration (docs/algorithm.md §4) belongs to a trained probability model: a softmax of
    # logits trained under a likelihood (plain's). `scores` names the predictors whose outputs
    # are not one, with why; their ECE, NLL, test entropy and reliability diagram are null.
    scores: ClassVar[dict[str, str]] = {}
    logged_predictor: ClassVar[str | None] = None  # whose logits `predict` returns; None: first
    # The layout of the method's trainable tree where its paths moved (None: as first written):
    # a checkpoint saved under another layout is refused in one line that names this one.
    layout: ClassVar[str | None] = None

    def __init__(self, cfg: ml_collections.ConfigDict):
        self.cfg = cfg
        self._compiled: dict[str, Callable] = {}
        peft = cfg.model.peft.kind
        if not self.uses_model_peft and peft != "none" and cfg.method.name == self.name:
            logging.info(
                "%s brings its own parameters: model.peft (%s) is not used.", self.name, peft
            )

    def compiled(self, name: str, fn: Callable, **jit_kwargs: Any) -> Callable:
        """`jax.jit(fn)` named `name` (the compile report's name), built once per instance: the
        fit check, `host_programs` and the hooks call one program, one compilation per run."""
        if name not in self._compiled:
            named = functools.wraps(fn)(functools.partial(fn))
            named.__name__ = named.__qualname__ = name
            self._compiled[name] = jax.jit(named, **jit_kwargs)
        return self._compiled[name]

    @classmethod
    def calibration_notes(cls) -> dict[str, str]:
        """`{predictor: "scores, not probabilities: <why>"}` for the predictors in `scores`."""
        return {p: f"{SCORES}: {why}" for p, why in cls.scores.items() if p in cls.predictors}

    @classmethod
    def entropy_note(cls) -> str | None:
        """The note of the logged entropy (the entropy of `predict`'s logits): that of the
        predictor they belong to; None where it is a probability model's."""
        return cls.calibration_notes().get(cls.logged_predictor or cls.predictors[0])

    @property
    def lr_scales(self) -> dict[str, float]:
        """`{label: s}`: the learning rate of that partition label is s times
        `optim.learning_rate` (a torch parameter group's own lr); the others train at it."""
        return {}

    @property
    def head_init(self) -> str:
        """The initialisation of every task head (`models/head.py` INITS): `method.head_init`,
        its official code's (`official_head_init`) where that is `official`."""
        chosen = self.cfg.method.get("head_init", OFFICIAL_HEAD_INIT)
        return type(self).official_head_init if chosen == OFFICIAL_HEAD_INIT else chosen

    @classmethod
    def earlier_head_init(cls, flat: dict[str, Any]) -> str:
        """The heads' init of a (flat) config saved before `method.head_init` existed."""
        return cls.head_init_before_field or cls.official_head_init

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        """Problems with this method's `method.*` fields, each naming the field and the fix."""
        return []

    @classmethod
    def memory_problems(
        cls, cfg: ml_collections.ConfigDict, left: int, where: str, seeds: int
    ) -> list[str]:
        """`method.*` values whose memory surely cannot fit the `left` bytes (the `where`),
        from the config alone, `seeds` seeds per device: one line each naming the field and
        what to set (`continual/fit.check_config`, before anything is built)."""
        return []

    # -- host side -------------------------------------------------------------------------

    def trains_task(self, task: int) -> bool:
        """Whether task `task` has optimizer steps; a method that only computes statistics
        (class prototypes) on some tasks returns False for them."""
        return True

    def init_state(self, trainable: Params) -> Params:
        """The method state before task 0, given the first trainable tree (every task's head
        and the method's task-0 leaves); its shapes hold for the whole run."""
        return {}

    def begin_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> tuple[Params, Params]:
        """Before task `task.index` (and its `grow`); returns (trainable, state)."""
        return trainable, state

    def grow(self, task: int, trainable: Params, key: jax.Array) -> Params:
        """Adds task `task`'s own trainable leaves (after its head grew); deterministic in `key`,
        since restoring a checkpoint rebuilds the tree's structure with it."""
        return trainable

    def end_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> Params:
        """After training task `task.index`, before its evaluation; returns the state."""
        return state

    def host_programs(
        self, trainable: Params, state: Params, frozen: Params, batch: Batch, task: int
    ) -> dict[str, tuple[Callable, tuple, int]]:
        """The method's own jitted programs, as its host hooks call them for one seed at task
        `task`: `{name: (fn, args, passes)}`, `fn(*args)` run on each evaluation-sized batch of
        the task's training images (`batch`), `passes` times per task and seed; `fn` is the
        jitted function the hooks call, so that the fit check's compilation is theirs. For
        planning (`aepg_jax.plan` compiles them for accelerators) and the fit check; `{}`:
        none."""
        return {}

    # -- inside the jitted train step ---------------------------------------------------------

    def forward(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[jax.Array, jax.Array | None]:
        """Training logits over every class of the run (the loss reads the task's own; classes
        of later tasks get no gradient), and an extra loss term (or None)."""
        logits, _ = net.apply(partition.merge(trainable, frozen), images, task.head_sizes)
        return logits, None

    def after_step(self, trainable: Params, state: Params, task: TaskSpec) -> Params:
        """The method state after an optimizer update gave `trainable`."""
        return state

    # -- inside the jitted evaluation ---------------------------------------------------------

    def predict(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[dict[str, jax.Array], jax.Array]:
        """Each predictor's probabilities over the classes (those after task `task.index`
        masked to probability 0), and the (masked) logits whose entropy is logged."""
        return predictions(
            net.apply(partition.merge(trainable, frozen), images, task.head_sizes)[0], task
        )


@jax.jit
def copied(tree: Params) -> Params:
    """`tree` in new buffers (a jitted program's outputs never alias its inputs): one program
    for the whole tree, where `jnp.copy` leaf by leaf would compile one per leaf shape."""
    return jax.tree.map(jnp.copy, tree)


def peft_of(trainable: Params) -> Params:
    """The PEFT leaves of a trainable tree (heads dropped)."""
    return partition.split(trainable, partition.label_params(trainable), (partition.PEFT,))[0]


def heads_of(trainable: Params) -> Params:
    """The head leaves of a trainable tree (PEFT dropped)."""
    return partition.split(trainable, partition.label_params(trainable), (partition.HEAD,))[0]


class ComposedParams:
    """For a method whose network is its own `self.net` on one parameter tree composed of the
    trainable tree, the frozen backbone and the state (`params`, the task index may be traced):
    training and evaluation both run `net(params(trainable, frozen, state, t))`, evaluation
    with the unseen classes masked. Put before `Method` in the bases."""

    net: Network

    def params(
        self, trainable: Params, frozen: Params, state: Params, task: int | jax.Array
    ) -> Params:
        raise NotImplementedError

    def forward(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[jax.Array, jax.Array | None]:
        params = self.params(trainable, frozen, state, task.index)
        return self.net.apply(params, images, task.head_sizes)[0], None

    def predict(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[dict[str, jax.Array], jax.Array]:
        params = self.params(trainable, frozen, state, task.index)
        return predictions(self.net.apply(params, images, task.head_sizes)[0], task)
