"""Building a continual run: its data, backbone, seeds and method (everything fixed for the run),
and its train state at a task's start or in a checkpoint.

`build(cfg, workdir)` validates the config against the devices, loads and caches the dataset,
cuts it into tasks, builds each seed's initial parameters (backbone + fresh PEFT) and returns
the `Run` that the trainer (`trainer.py`) and the planner read.

The trainable tree during task t is the initial PEFT plus every task's head (head s initialised
from the seed's key, `fold_in(key, 1000 + s)`, present from the start so that the shapes, and
the compiled programs, hold for the whole run) plus whatever the method grows for tasks 0..t
(`fold_in(key, 2000 + t)`); rebuilding it from the keys gives any checkpoint's structure.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from aepg_jax import losses, methods
from aepg_jax.checkpoints import augreg, weights
from aepg_jax.config import schema
from aepg_jax.continual import steps
from aepg_jax.data import cache, datasets, loader, source, splits
from aepg_jax.methods.base import copied as base_copied
from aepg_jax.models import head, partition, vit
from aepg_jax.pretraining import pretrain
from aepg_jax.runs import checkpointing, seeds
from aepg_jax.runs.seeds import SeedAxis
from aepg_jax.system import compiles

Params = dict[str, Any]

# Version of the checkpointed state's layout (every task's head from the start, the method's
# state in `TrainState.method_state` from task 0); a checkpoint of another layout is refused.
STATE_LAYOUT = 3


@dataclasses.dataclass(frozen=True)
class RunData:
    """The cached splits and the task split of a run."""

    name: str
    class_names: tuple[str, ...]
    train: cache.CachedSplit
    test: cache.CachedSplit
    tasks: splits.TaskSplit


def prepare_data(cfg: ml_collections.ConfigDict) -> RunData:
    """Loads the dataset, caches both splits at `data.store_size`, cuts it into tasks."""
    d = cfg.data
    ds = datasets.load_configured(d)
    schema.validate_against_dataset(cfg, len(ds.class_names), ds.domain_names, ds.name)
    root = os.path.expanduser(d.cache_dir)
    name = datasets.run_name(d, ds)
    built = {
        split: cache.load_or_build(
            getattr(ds, split),
            root,
            name,
            split,
            d.store_size,
            class_names=ds.class_names,
            verify=d.verify_cache,
            progress=jax.process_index() == 0,
        )
        for split in ("train", "test")
    }
    domains = (
        (source.domains_of(ds.train), source.domains_of(ds.test), ds.domain_names)
        if d.scenario == "domain"
        else None
    )
    tasks = task_split(d, built["train"].labels, built["test"].labels, len(ds.class_names), domains)
    _require_examples(ds.name, tasks, d.num_tasks)
    if d.label_noise:
        logging.info(
            "Label noise %.3f requested, %.4f realised.", d.label_noise, tasks.realised_noise_rate
        )
    return RunData(ds.name, ds.class_names, built["train"], built["test"], tasks)


def task_split(
    d: ml_collections.ConfigDict,
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
    domains: tuple[np.ndarray, np.ndarray, tuple[str, ...]] | None = None,
) -> splits.TaskSplit:
    """The tasks of the `data` block `d` (`data.scenario`): classes cut into `data.num_tasks`
    groups, or one task per domain, `domains` = (train ids, test ids, domain names)."""
    kwargs = dict(
        class_order_seed=d.class_order_seed,
        class_order_rng=d.get("class_order_rng", "default"),
        label_noise=d.label_noise,
        noise_seed=d.noise_seed,
    )
    if d.scenario == "domain":
        if domains is None:
            raise ValueError("data.scenario=domain needs the dataset's domain ids.")
        train_domains, test_domains, names = domains
        return splits.make_domain_incremental(
            train_labels, test_labels, train_domains, test_domains, num_classes, names, **kwargs
        )
    return splits.make_class_incremental(
        train_labels, test_labels, num_classes, d.num_tasks, **kwargs
    )


def _require_examples(name: str, tasks: splits.TaskSplit, num_tasks: int) -> None:
    """Every task needs training and test examples: accuracy over an empty test set is undefined
    (and a task without training examples would train its head on nothing)."""
    for task in tasks.tasks:
        if task.domain is None:
            what, fix = f"original classes {task.original_classes.tolist()}", ", or use fewer tasks"
        else:
            what, fix = f"domain {task.domain!r}", ""
        for split, indices in (("train", task.train_indices), ("test", task.test_indices)):
            if not len(indices):
                raise ValueError(
                    f"data.num_tasks={num_tasks}: task {task.index + 1} of {name} ({what}) has "
                    f"no {split} examples; check the prepared data or the split{fix}."
                )


def initial_params(cfg: ml_collections.ConfigDict, key: jax.Array, mesh) -> Params:
    """Backbone (random, augreg file or pretrained) + fresh PEFT, no heads yet."""
    return loaded_backbone(cfg, vit.init_params(cfg.model, jax.random.fold_in(key, 0)), mesh)


def loaded_backbone(cfg: ml_collections.ConfigDict, params: Params, mesh) -> Params:
    """`params` (arrays or shapes) with the backbone `model.init` names loaded in: an augreg
    or timm file, or the project's pretraining; unchanged for a random backbone."""
    if cfg.model.init == "augreg":
        try:
            path = weights.local_path(weights.checkpoint_of(cfg.model))
            return weights.load_backbone(path, params)
        except augreg.CheckpointError as err:  # name the field the user set
            field = "model.checkpoint" if cfg.model.checkpoint else "model.weights"
            raise augreg.CheckpointError(f"{field}: {err}") from err
    if cfg.model.init == "pretrained":
        return augreg.load_backbone(pretrain.pretrain_backbone(cfg, mesh), params)
    return params


def backbone_source(cfg: ml_collections.ConfigDict) -> dict | None:
    """The file the backbone was loaded from, for results.json: `path`, `shipped` and, for a
    pretrained one, `sha256` (`pretrain.file_fingerprint`); None for a random backbone. (For
    `model.init=augreg`, `build` adds the file's format, sha256 and weights tag.)"""
    if cfg.model.init == "augreg":
        return {"path": weights.checkpoint_of(cfg.model), "shipped": False}
    if cfg.model.init != "pretrained":
        return None
    shipped = pretrain.shipped_backbone(cfg)
    path = shipped or pretrain.backbone_path(cfg)
    return {"path": path, "shipped": shipped is not None, "sha256": pretrain.file_fingerprint(path)}


def step_config(cfg: ml_collections.ConfigDict) -> steps.StepConfig:
    return steps.StepConfig(
        image_size=cfg.model.image_size,
        crop_scale=tuple(cfg.data.crop_scale),
        crop_ratio=tuple(cfg.data.crop_ratio),
        flip_prob=cfg.data.flip_prob,
        normalize=cfg.input.normalize,
    )


@dataclasses.dataclass(frozen=True)
class Run:
    """The fixed context of one run.

    With `num_seeds = S > 1` every per-seed tree (train state, PEFT, heads, method state)
    carries a leading seed axis (`axis`); the frozen backbone is shared unless it is itself
    seed-dependent (`model.init=random`, then `frozen_axis = 0`).
    """

    cfg: ml_collections.ConfigDict
    workdir: str
    mesh: jax.sharding.Mesh
    is_main: bool
    data: RunData
    axis: SeedAxis
    keys: tuple[jax.Array, ...]  # one base key per seed
    initial_peft: tuple[Params, ...]  # one fresh PEFT tree per seed
    frozen: Params  # the backbone, on the devices (stacked per seed iff frozen_axis == 0)
    frozen_axis: int | None
    fingerprint: str  # sha256 of the frozen backbone, checked on resume
    method: methods.Method
    net: methods.Network
    step_cfg: steps.StepConfig
    loss_fn: Callable[..., jax.Array]
    annealed: bool
    fixed_alpha: float | None = None  # a fixed mix's alpha (logged); None: annealed or none
    backbone_source: dict | None = None  # the backbone's file (shipped, cached or augreg)
    # The jitted programs building its states (`_program`), made once per run.
    state_programs: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def replicated(self) -> jax.sharding.NamedSharding:
        return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())

    @property
    def head_sizes(self) -> tuple[int, ...]:
        """The model's heads: one per task (class scenario) or one over every class (domain)."""
        return tuple(self.data.tasks.head_sizes)

    @property
    def num_tasks(self) -> int:
        return self.data.tasks.num_tasks

    def frozen_of(self, seed_index: int) -> Params:
        """One seed's frozen backbone."""
        if self.frozen_axis is None:
            return self.frozen
        return jax.tree.map(lambda x: x[seed_index], self.frozen)


def initial_trees(cfg: ml_collections.ConfigDict, key: jax.Array, mesh) -> tuple[Params, Params]:
    """One seed's `(fresh PEFT, backbone)` trees (`initial_params` split by label)."""
    params = initial_params(cfg, key, mesh)
    return partition.split(params, partition.label_params(params), partition.TRAINABLE)


def initial_trees_all(
    cfg: ml_collections.ConfigDict, keys: tuple[jax.Array, ...], mesh
) -> tuple[list[Params], list[Params]]:
    """Every seed's fresh PEFT, and the backbones: one per seed for `model.init=random`, else
    the one loaded (or pretrained) backbone. For a loaded backbone the PEFT is drawn by one
    jitted program for every seed (XLA drops the unused random backbone; op by op, each
    operation of the initialisation would compile on its own). A random backbone is drawn op
    by op: a jitted draw of the whole tree rounds some of its scaled normal draws differently."""
    if cfg.model.init == "random":
        pairs = [initial_trees(cfg, key, mesh) for key in keys]
        return [p for p, _ in pairs], [b for _, b in pairs]

    def random_trees(key: jax.Array) -> tuple[Params, Params]:
        params = vit.init_params(cfg.model, jax.random.fold_in(key, 0))  # `initial_params`'
        return partition.split(params, partition.label_params(params), partition.TRAINABLE)

    def initial_peft(key: jax.Array) -> Params:
        return random_trees(key)[0]

    draw_peft = jax.jit(initial_peft, compiler_options=compiles.EAGER_NUMERICS)
    peft = [draw_peft(key) for key in keys]
    shapes = jax.eval_shape(lambda key: random_trees(key)[1], keys[0])
    params = loaded_backbone(cfg, partition.merge(peft[0], shapes), mesh)
    _, backbone = partition.split(params, partition.label_params(params), partition.TRAINABLE)
    return peft, [backbone]


def seed_axis(cfg: ml_collections.ConfigDict) -> tuple[SeedAxis, tuple[jax.Array, ...], int | None]:
    """The run's seeds, one base key per seed, and the frozen backbone's seed axis (0 when
    `num_seeds > 1` with a random backbone, which is then drawn per seed; else None)."""
    axis = SeedAxis(tuple(cfg.seed + i for i in range(cfg.num_seeds)))
    keys = tuple(jax.random.PRNGKey(s) for s in axis.seeds)
    frozen_axis = 0 if axis.vmapped and cfg.model.init == "random" else None
    return axis, keys, frozen_axis


def assemble(
    cfg: ml_collections.ConfigDict,
    workdir: str,
    mesh: jax.sharding.Mesh,
    data: RunData,
    initial_peft: tuple[Params, ...],
    frozen: Params,
    fingerprint: str,
) -> Run:
    """The `Run` of `cfg` from its data and parameters (`build`; `aepg_jax.plan` passes shapes)."""
    axis, keys, frozen_axis = seed_axis(cfg)
    return Run(
        cfg=cfg,
        workdir=workdir,
        mesh=mesh,
        is_main=jax.process_index() == 0,
        data=data,
        axis=axis,
        keys=keys,
        initial_peft=tuple(initial_peft),
        frozen=frozen,
        frozen_axis=frozen_axis,
        fingerprint=fingerprint,
        method=methods.get(cfg.method.name)(cfg),
        net=methods.Network(cfg.model),
        step_cfg=step_config(cfg),
        loss_fn=losses.get_loss(cfg.loss.name, **schema.loss_kwargs(cfg)),
        annealed=losses.is_annealed(cfg.loss.name),
        fixed_alpha=losses.fixed_alpha(cfg.loss.name, **schema.loss_kwargs(cfg)),
        backbone_source=backbone_source(cfg),
    )


def build(cfg: ml_collections.ConfigDict, workdir: str) -> Run:
    """Validates `cfg`, prepares the data and every seed's initial parameters."""
    mesh = loader.data_mesh()
    schema.validate(cfg, mesh.devices.size)
    data = prepare_data(cfg)
    _, keys, frozen_axis = seed_axis(cfg)
    # A pretrained or loaded backbone is the same for every seed; a random one is not.
    initial_peft, frozen = initial_trees_all(cfg, keys, mesh)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    frozen_tree = jax.device_put(seeds.stack(frozen) if frozen_axis == 0 else frozen[0], replicated)
    del frozen
    run = assemble(
        cfg,
        workdir,
        mesh,
        data,
        tuple(initial_peft),
        frozen_tree,
        checkpointing.backbone_fingerprint(frozen_tree),
    )
    if cfg.model.init != "augreg":
        return run
    # The loaded file: format, sha256 and which weights (model.weights, or the paper's or
    # timm's augreg2 read from the name).
    checkpoint = weights.checkpoint_of(cfg.model)
    info = weights.identify(checkpoint, weights.local_path(checkpoint), cfg.model.get("weights"))
    if run.is_main:
        print(weights.describe(info), flush=True)
    return dataclasses.replace(run, backbone_source={**info, "shipped": False})


def _program(run: Run, name: str, make: Callable[[], Callable]) -> Callable:
    """The run's jitted program `name` (`make()` the first time): compiled once for the run."""
    if name not in run.state_programs:
        run.state_programs[name] = make()
    return run.state_programs[name]


def _on_seeds(run: Run, fn: Callable, name: str, in_axes: Any = 0, draws: bool = False) -> Callable:
    """jit of `fn(key, *trees)` of one seed over every seed, named `name`, made once per run
    (`_program`), so compiled once: called with the seeds' base keys and the run's trees
    (stacked when `num_seeds > 1`; committed to the run's devices, so that every call has the
    first's shardings), the keys stacked inside. `draws`: it draws random values, which it
    must draw as op-by-op dispatch would (`compiles.EAGER_NUMERICS`)."""
    lifted = run.axis.lift(fn, in_axes)

    def over_seeds(keys, *trees):
        return lifted(run.axis.stack(list(keys)), *trees)

    over_seeds.__name__ = over_seeds.__qualname__ = name
    program = jax.jit(over_seeds, compiler_options=compiles.EAGER_NUMERICS if draws else None)
    return lambda keys, *trees: program(keys, *jax.device_put(trees, run.replicated))


def overrides(method: methods.Method, hook: str) -> bool:
    """Whether `method` has its own `hook` (the base's does nothing: no program to run)."""
    return getattr(type(method), hook) is not getattr(methods.Method, hook)


def with_heads(run: Run, trainable: Params) -> Params:
    """Every task's head added to every seed's tree, head t initialised (`run.method.head_init`)
    from `fold_in(key, 1000 + t)` as if it grew at task t's start: the tree's shapes hold for
    the whole run (the classes of later tasks are masked, their heads get no gradient). One
    program for every seed."""
    width, init = run.cfg.model.hidden_size, run.method.head_init

    def one_seed(key: jax.Array, tree: Params) -> Params:
        for t, n in enumerate(run.head_sizes):
            tree = head.grow(tree, jax.random.fold_in(key, 1000 + t), n, width, init)
        return tree

    return _program(run, "with_heads", lambda: _on_seeds(run, one_seed, "with_heads", draws=True))(
        run.keys, trainable
    )


def grow(run: Run, trainable: Params, task: int) -> Params:
    """Adds the method's own task leaves of task `task` to every seed's tree (the heads are
    there from the start, `with_heads`): one jitted program per task, or the method's hook on
    the host where it computes there (`Method.grows_on_host`)."""
    if not overrides(run.method, "grow"):
        return trainable
    if run.method.grows_on_host:
        keys = [jax.random.fold_in(key, 2000 + task) for key in run.keys]
        return run.axis.map(lambda i, tree: run.method.grow(task, tree, keys[i]), trainable)

    def one_seed(key: jax.Array, tree: Params) -> Params:
        return run.method.grow(task, tree, jax.random.fold_in(key, 2000 + task))

    name = f"grow_task_{task}"
    program = _program(run, name, lambda: _on_seeds(run, one_seed, name, draws=True))
    return program(run.keys, trainable)


def first_trainable(run: Run) -> Params:
    """The trainable tree before task 0's hooks: the initial PEFT and every task's head, and a
    copy of each seed's backbone under `finetuned/` for a method that fine-tunes it whole
    (`Method.finetunes_backbone`)."""
    trainable = with_heads(run, run.axis.stack(list(run.initial_peft)))
    if not run.method.finetunes_backbone:
        return trainable
    backbone = run.frozen
    if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(backbone)):
        # Shapes only (`aepg_jax.plan`, which runs the state programs on real trainable
        # trees): zeros of the copy's shapes, per seed when vmapped.
        lead = (len(run.axis.seeds),) if run.axis.vmapped and run.frozen_axis is None else ()
        copy = jax.tree.map(lambda x: jnp.zeros(lead + x.shape, x.dtype), backbone)
        return {**trainable, partition.FINETUNED: copy}
    if run.axis.vmapped and run.frozen_axis is None:
        backbone = run.axis.stack([backbone] * len(run.axis.seeds))
    return {**trainable, partition.FINETUNED: base_copied(backbone)}


def trainable_for(run: Run, task: int) -> Params:
    """The trainable tree of task `task` as first built (deterministic per seed)."""
    trainable = first_trainable(run)
    for t in range(task + 1):
        trainable = grow(run, trainable, t)
    return trainable


def initial_method_state(run: Run) -> Params:
    """Every seed's method state before task 0 (`Method.init_state` of task 0's tree), one
    program for every seed."""
    trainable = trainable_for(run, 0)
    if not overrides(run.method, "init_state"):
        return run.axis.stack([run.method.init_state(tr) for tr in run.axis.unstack(trainable)])

    def one_seed(key: jax.Array, tree: Params) -> Params:
        return run.method.init_state(tree)

    program = _program(run, "init_state", lambda: _on_seeds(run, one_seed, "init_state"))
    return program(run.keys, trainable)


def fresh_state(
    run: Run, trainable: Params, method_state: Params, global_step: int
) -> steps.TrainState:
    """A task's first state: a new optimizer state, task step 0, the seed's RNG; one program
    for every seed, whose outputs are new buffers (the train step donates its state, which
    must never alias `initial_peft`)."""

    def one_seed(key: jax.Array, tr: Params, ms: Params, step: jax.Array) -> steps.TrainState:
        return steps.TrainState(
            trainable=tr,
            opt_state=steps.optimizer(run.cfg, tr, lr_scales=run.method.lr_scales).init(tr),
            method_state=ms,
            task_step=jnp.zeros([], jnp.int32),
            global_step=step,
            rng=jax.random.fold_in(key, 7),
            first_bad_step=jnp.asarray(-1, jnp.int32),
        )

    program = _program(
        run, "fresh_state", lambda: _on_seeds(run, one_seed, "fresh_state", (0, 0, 0, None))
    )
    state = program(run.keys, trainable, method_state, np.int32(global_step))
    return jax.device_put(state, run.replicated)


def checkpoint_target(run: Run, meta: dict) -> dict[str, steps.TrainState]:
    """A state of the structure of the checkpoint described by `meta` (values arbitrary)."""
    where = os.path.join(run.workdir, "checkpoints")
    if meta.get("state_layout") != STATE_LAYOUT:
        raise checkpointing.IncompatibleCheckpoint(
            f"The checkpoints in {where} were written by an older aepg_jax (state layout "
            f"{meta.get('state_layout', 1)}, this one reads {STATE_LAYOUT}); use a new workdir."
        )
    if meta.get("method_layout") != run.method.layout:
        raise checkpointing.IncompatibleCheckpoint(
            f"The checkpoints in {where} keep {run.method.name}'s parameters in an older layout; "
            f"this aepg_jax has {run.method.layout}; use a new workdir."
        )
    if meta.get("seeds") != list(run.axis.seeds):
        raise checkpointing.IncompatibleCheckpoint(
            f"The checkpoints in {where} hold seeds {meta.get('seeds')}, this run trains "
            f"{list(run.axis.seeds)}; use a new workdir."
        )
    task = meta["task"]
    trainable = trainable_for(run, task)
    one = run.method.init_state(run.axis.unstack(trainable_for(run, 0))[0])  # run-static shapes
    method_state = run.axis.stack([one] * len(run.axis.seeds))
    return {"state": fresh_state(run, trainable, method_state, 0)}
