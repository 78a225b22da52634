"""The class-incremental task loop (SPEC §4, §6, §7): data -> model -> per-task training ->
evaluation of every seen task -> checkpoint -> reports.

For each task t: grow the head, build a fresh optimizer state, train `optim.epochs` epochs with
the configured loss (alpha schedule restarting per task; PEFT frozen for the first
`optim.peft_freeze_epochs` epochs of tasks >= 1, without recompiling), then (LAE) create the
offline PEFT at the end of task 0, evaluate all seen tasks task-agnostically, and checkpoint.
Methods: `plain`, `lae` (EMA offline PEFT, max-probability ensemble), `lwf` (distillation from
the previous task's frozen copy); any loss, any PEFT kind.

`run(cfg, workdir)` resumes from the newest checkpoint in `<workdir>/checkpoints` when there is
one; a resumed run ends with the same results as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm

from aepg_jax import config_lib, losses, partition, pretrain, schedules
from aepg_jax.checkpoints import augreg
from aepg_jax.continual import checkpointing, metrics, report
from aepg_jax.continual import train_step as ts
from aepg_jax.data import cache, datasets, loader, splits
from aepg_jax.models import head, vit

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class RunData:
    """The cached splits and the task split of a run."""

    name: str
    class_names: tuple[str, ...]
    train: cache.CachedSplit
    test: cache.CachedSplit
    tasks: splits.ClassIncremental


def prepare_data(cfg: ml_collections.ConfigDict) -> RunData:
    """Loads the dataset, caches both splits at `data.store_size`, cuts it into tasks."""
    d = cfg.data
    ds = datasets.load_dataset(d.source, name=d.name, data_dir=d.data_dir, split_seed=d.split_seed)
    config_lib.validate_against_dataset(cfg, len(ds.class_names))
    root = os.path.expanduser(d.cache_dir)
    name = ds.name if d.source != "digits" else f"digits-split{d.split_seed}"
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
    tasks = splits.make_class_incremental(
        built["train"].labels,
        built["test"].labels,
        len(ds.class_names),
        d.num_tasks,
        class_order_seed=d.class_order_seed,
        label_noise=d.label_noise,
        noise_seed=d.noise_seed,
    )
    if d.label_noise:
        logging.info(
            "Label noise %.3f requested, %.4f realised.", d.label_noise, tasks.realised_noise_rate
        )
    return RunData(ds.name, ds.class_names, built["train"], built["test"], tasks)


def initial_params(cfg: ml_collections.ConfigDict, key: jax.Array, mesh) -> Params:
    """Backbone (random, augreg file or pretrained) + fresh PEFT, no heads yet."""
    params = vit.init_params(cfg.model, jax.random.fold_in(key, 0))
    if cfg.model.init == "augreg":
        params = augreg.load_backbone(cfg.model.checkpoint, params)
    elif cfg.model.init == "pretrained":
        params = augreg.load_backbone(pretrain.pretrain_backbone(cfg, mesh), params)
    return params


def step_config(cfg: ml_collections.ConfigDict) -> ts.StepConfig:
    return ts.StepConfig(
        image_size=cfg.model.image_size,
        crop_scale=tuple(cfg.data.crop_scale),
        crop_ratio=tuple(cfg.data.crop_ratio),
        flip_prob=cfg.data.flip_prob,
        normalize=cfg.input.normalize,
        ema_decay=cfg.method.ema_decay,
        lwf_temperature=cfg.method.lwf_temperature,
        lwf_weight=cfg.method.lwf_weight,
    )


def predictors(cfg: ml_collections.ConfigDict) -> tuple[str, ...]:
    """Names of the evaluated predictors; the first is the primary one."""
    return ("ensemble", "online", "offline") if cfg.method.name == "lae" else ("model",)


def _apply_fn(cfg: ml_collections.ConfigDict, head_sizes: tuple[int, ...]):
    model = vit.build(cfg.model, head_sizes)
    return lambda params, images: model.apply({"params": params}, images)


def _optimizer(cfg: ml_collections.ConfigDict, trainable: Params):
    o = cfg.optim
    return partition.make_optimizer(
        partition.label_params(trainable), optax.adam(o.learning_rate, o.b1, o.b2, o.eps)
    )


@dataclasses.dataclass(frozen=True)
class TaskPlan:
    """Step counts of one task."""

    steps_per_epoch: int
    total_steps: int
    freeze_steps: int


def plan_task(cfg: ml_collections.ConfigDict, task: splits.Task) -> TaskPlan:
    o = cfg.optim
    per_epoch = loader.num_batches(len(task.train_indices), o.batch_size, drop_last=True)
    if per_epoch == 0:
        raise ValueError(
            f"Task {task.index} has {len(task.train_indices)} training examples, fewer than "
            f"optim.batch_size={o.batch_size}; lower the batch size or use fewer tasks."
        )
    total = o.epochs * per_epoch
    if cfg.max_steps_per_task:
        total = min(total, cfg.max_steps_per_task)
    freeze = int(total * o.peft_freeze_epochs / o.epochs) if task.index >= 1 else 0
    return TaskPlan(per_epoch, total, freeze)


def _stack(trees: list[Any]) -> Any:
    """Stacks equally shaped trees on a new leading (seed) axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _seed_config(cfg: ml_collections.ConfigDict, seed: int) -> dict:
    """The config of seed `seed` of a multi-seed run, as a single run of that seed has it."""
    d = cfg.to_dict()
    d["seed"], d["num_seeds"] = int(seed), 1
    return d


class _Run:
    """The mutable bookkeeping of one `run` call (kept out of the jitted functions).

    With `num_seeds = S > 1` every per-seed tree (train state, PEFT, heads, LwF copy) carries a
    leading seed axis and the jitted step and evaluation are `jax.vmap`-ed over it; the frozen
    backbone is shared unless it is itself seed-dependent (`model.init=random`). Host-side
    bookkeeping (trackers, metric writers) is one per seed. With S = 1 nothing is stacked or
    vmapped: the trees and functions are exactly those of a single run.
    """

    def __init__(self, cfg: ml_collections.ConfigDict, workdir: str):
        self.cfg, self.workdir = cfg, workdir
        self.mesh = loader.data_mesh()
        config_lib.validate(cfg, self.mesh.devices.size)
        self.is_main = jax.process_index() == 0
        self.data = prepare_data(cfg)
        self.seeds = tuple(cfg.seed + i for i in range(cfg.num_seeds))
        self.vmapped = len(self.seeds) > 1
        self.keys = [jax.random.PRNGKey(s) for s in self.seeds]
        self.replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        self.initial_peft, frozen = [], []
        for key in self.keys:
            params = initial_params(cfg, key, self.mesh)
            peft, backbone = partition.split(
                params, partition.label_params(params), partition.TRAINABLE
            )
            self.initial_peft.append(peft)
            # A pretrained or loaded backbone is the same for every seed; a random one is not.
            if not frozen or cfg.model.init == "random":
                frozen.append(backbone)
        self.frozen_axis = 0 if self.vmapped and cfg.model.init == "random" else None
        self.frozen = jax.device_put(
            _stack(frozen) if self.frozen_axis == 0 else frozen[0], self.replicated
        )
        del frozen
        self.fingerprint = checkpointing.backbone_fingerprint(self.frozen)
        self.ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"))
        self.seed_dirs = (
            [os.path.join(workdir, f"seed_{s}") for s in self.seeds] if self.vmapped else [workdir]
        )
        self.writers = [report.MetricsWriter(d, enabled=self.is_main) for d in self.seed_dirs]
        self.predictors = predictors(cfg)
        self.trackers = [
            metrics.AccuracyTracker(cfg.data.num_tasks, self.predictors) for _ in self.seeds
        ]
        self.head_sizes = self.data.tasks.head_sizes
        self.lae = cfg.method.name == "lae"
        self.lwf = cfg.method.name == "lwf"
        self.step_cfg = step_config(cfg)
        self.loss_fn = losses.get_loss(cfg.loss.name, **config_lib.loss_kwargs(cfg))
        self.annealed = losses.is_annealed(cfg.loss.name)
        self.elapsed_before = 0.0

    # -- the seed axis -------------------------------------------------------------------------

    def stack(self, trees: list[Any]) -> Any:
        """One tree per seed -> the run's tree (stacked when vmapped, else the only one)."""
        return _stack(trees) if self.vmapped else trees[0]

    def unstack(self, tree: Any) -> list[Any]:
        """The run's tree -> one tree per seed."""
        if not self.vmapped:
            return [tree]
        return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(len(self.seeds))]

    def lift(self, fn: Callable, in_axes: tuple) -> Callable:
        """`fn` of one seed -> `fn` of the run (vmapped over the seed axis when S > 1)."""
        return jax.vmap(fn, in_axes=in_axes) if self.vmapped else fn

    def per_seed(self, x: Any) -> np.ndarray:
        """A host copy of a per-seed scalar (or per-seed vector `(S, k)`): shape (S, ...)."""
        x = np.asarray(jax.device_get(x))
        return x.reshape(len(self.seeds), *x.shape[int(self.vmapped) :])

    def first(self, x: Any) -> int:
        """A counter that is the same for every seed (global or task step)."""
        return int(self.per_seed(x).reshape(-1)[0])

    # -- state construction ------------------------------------------------------------------

    def grow_heads(self, trainable: Params, task: int) -> Params:
        """Adds task `task`'s head (initialised from each seed's key) to every seed's tree."""
        return self.stack(
            [
                head.grow(
                    tree,
                    jax.random.fold_in(key, 1000 + task),
                    self.head_sizes[task],
                    self.cfg.model.hidden_size,
                )
                for tree, key in zip(self.unstack(trainable), self.keys, strict=True)
            ]
        )

    def trainable_for(self, task: int) -> Params:
        """Initial PEFT plus freshly grown heads of tasks 0..task (deterministic per seed)."""
        trainable = self.stack(self.initial_peft)
        for t in range(task + 1):
            trainable = self.grow_heads(trainable, t)
        return trainable

    def fresh_state(self, trainable: Params, offline: Params, global_step: int) -> ts.TrainState:
        optimizer = _optimizer(self.cfg, self.unstack(trainable)[0])
        states = [
            ts.TrainState(
                trainable=tr,
                opt_state=optimizer.init(tr),
                offline_peft=off,
                task_step=jnp.zeros([], jnp.int32),
                global_step=jnp.asarray(global_step, jnp.int32),
                rng=jax.random.fold_in(key, 7),
                first_bad_step=jnp.asarray(-1, jnp.int32),
            )
            for tr, off, key in zip(
                self.unstack(trainable), self.unstack(offline), self.keys, strict=True
            )
        ]
        # Copies: the train step donates its state, which must never alias `initial_peft`.
        state = jax.tree.map(lambda x: jnp.array(x, copy=True), self.stack(states))
        return jax.device_put(state, self.replicated)

    def checkpoint_target(self, meta: dict) -> tuple[ts.TrainState, Params | None]:
        """Trees of the right structure for a checkpoint described by `meta`."""
        task = meta["task"]
        trainable = self.trainable_for(task)
        peft = partition.split(trainable, partition.label_params(trainable), (partition.PEFT,))[0]
        has_offline = self.lae and not (task == 0 and meta["phase"] == "in_task")
        state = self.fresh_state(trainable, peft if has_offline else {}, 0)
        lwf = (
            self.trainable_for(task - 1)
            if (self.lwf and task >= 1 and meta["phase"] == "in_task")
            else None
        )
        return state, lwf

    def meta(self, task: int, phase: str, epoch: int) -> dict:
        return {
            "task": task,
            "phase": phase,
            "epoch": epoch,
            "seeds": list(self.seeds),
            "trackers": [t.to_dict() for t in self.trackers],
            "head_sizes": list(self.head_sizes[: task + 1]),
            "backbone_sha256": self.fingerprint,
            "elapsed_s": self.elapsed_before + time.time() - self.started,
        }

    # -- checks --------------------------------------------------------------------------------

    def check_finite(self, state: ts.TrainState, task: int) -> None:
        bad = self.per_seed(state.first_bad_step)
        if (bad >= 0).any():
            steps = self.ckpt.steps()
            last = (
                f"checkpoint {steps[-1]} in {self.ckpt.directory}"
                if steps
                else "none (no checkpoint yet)"
            )
            i = int(np.argmax(bad >= 0))
            which = f" (seed {self.seeds[i]})" if self.vmapped else ""
            raise FloatingPointError(
                f"Non-finite loss in task {task} at global step {int(bad[i])}{which}. Last good "
                f"checkpoint: {last}. Lower optim.learning_rate or check the data and loss "
                "settings."
            )

    # -- evaluation ----------------------------------------------------------------------------

    def evaluate(self, task: int, state: ts.TrainState) -> list[dict]:
        """Accuracy of every predictor on every seen task, per seed; records it in the trackers."""
        apply_fn = _apply_fn(self.cfg, self.head_sizes[: task + 1])
        num_seen = self.data.tasks.tasks[task].stop
        eval_step = ts.make_eval_step(apply_fn, num_seen, self.lae, self.step_cfg)
        lae = self.lae

        def eval_seed(trainable, offline_peft, frozen, batch):
            online = partition.merge(trainable, frozen)
            offline = None
            if lae:
                heads, _ = partition.split(
                    trainable, partition.label_params(trainable), (partition.HEAD,)
                )
                offline = partition.merge(offline_peft, heads, frozen)
            return eval_step(online, offline, batch)

        eval_fn = jax.jit(self.lift(eval_seed, (0, 0, self.frozen_axis, None)))
        num_seeds = len(self.seeds)
        entropy_sum, count_all = np.zeros(num_seeds), 0
        per_task: list[dict] = [{} for _ in self.seeds]
        for i in range(task + 1):
            sums = None
            for batch in loader.iterate(
                self.data.test.images,
                self.data.tasks.test_labels,
                self.data.tasks.tasks[i].test_indices,
                self.cfg.eval.batch_size,
                self.mesh,
                train=False,
            ):
                out = eval_fn(state.trainable, state.offline_peft, self.frozen, batch)
                sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
            sums = {k: self.per_seed(v) for k, v in sums.items()}
            count = int(sums["count"][0])
            for s, tracker in enumerate(self.trackers):
                for p in self.predictors:
                    tracker.record(task, p, i, int(sums[p][s]), count)
                per_task[s][i] = {
                    p: 100.0 * int(sums[p][s]) / max(count, 1) for p in self.predictors
                }
            entropy_sum += sums["entropy_sum"]
            count_all += count
        results = []
        for s, tracker in enumerate(self.trackers):
            entropy = float(entropy_sum[s]) / max(count_all, 1)
            tracker.record_entropy(task, entropy)
            results.append({"per_task": per_task[s], "entropy": entropy})
        return results

    # -- training ------------------------------------------------------------------------------

    def train_task(
        self, t: int, state: ts.TrainState, lwf: Params | None, start_step: int
    ) -> ts.TrainState:
        """Trains task `t` from `start_step`; logs, checkpoints and checks for NaN on the way."""
        cfg, task = self.cfg, self.data.tasks.tasks[t]
        plan = plan_task(cfg, task)
        spec = ts.TaskSpec(
            offset=task.offset,
            num_classes=task.num_classes,
            freeze_steps=plan.freeze_steps,
            lae_ema=self.lae and t >= 1,
            lwf=self.lwf and t >= 1,
        )
        schedule = schedules.get_schedule(
            cfg.schedule.name, plan.total_steps, **config_lib.schedule_kwargs(cfg)
        )
        one_seed = self.unstack(state.trainable)[0]
        step_fn = ts.make_train_step(
            _apply_fn(cfg, self.head_sizes[: t + 1]),
            self.loss_fn,
            self.annealed,
            schedule,
            _optimizer(cfg, one_seed),
            partition.label_params(one_seed),
            spec,
            self.step_cfg,
            _apply_fn(cfg, self.head_sizes[:t]) if (self.lwf and t >= 1) else None,
        )

        def seed_step(state, frozen, lwf_trainable, batch, train_peft):
            lwf_params = None
            if lwf_trainable is not None:
                lwf_params = partition.merge(lwf_trainable, frozen)
            return step_fn(state, frozen, lwf_params, batch, train_peft)

        lifted = self.lift(seed_step, (0, self.frozen_axis, 0, 0, None))
        vmapped = self.vmapped

        def run_step(state, frozen, lwf, batch):
            # Every seed is at the same task step: one unbatched phase flag for all of them.
            train_peft = state.task_step[0] >= spec.freeze_steps if vmapped else None
            return lifted(state, frozen, lwf, batch, train_peft)

        chunks = (self._scanned_chunks if cfg.optim.steps_per_call > 1 else self._step_chunks)(
            run_step, t, plan, state, lwf, start_step
        )
        bar = tqdm.tqdm(
            total=plan.total_steps,
            initial=start_step,
            unit="step",
            desc=f"task {t + 1}/{len(self.head_sizes)}"
            + (f" x {len(self.seeds)} seeds" if self.vmapped else ""),
            disable=not self.is_main,
            dynamic_ncols=True,
        )
        last_log, last_time = start_step, time.time()
        every, log_every = cfg.checkpoint_every_steps, cfg.log_every_steps
        for state, step, k, metrics_chunk in chunks:
            bar.update(k)
            logged = [
                s
                for s in range(step - k + 1, step + 1)
                if s % log_every == 0 or s == plan.total_steps
            ]
            if logged:
                self.check_finite(state, t)
                # One host sync per logged chunk; arrays (S, k).
                host = {key: self.per_seed(v).reshape(-1, k) for key, v in metrics_chunk.items()}
                now = time.time()
                ips = (step - last_log) * cfg.optim.batch_size / max(now - last_time, 1e-9)
                last_log, last_time = step, now
                global_end = self.first(state.global_step)
                for s in logged:
                    j = s - (step - k + 1)
                    for i, writer in enumerate(self.writers):
                        m = {key: value[i, j] for key, value in host.items()}
                        writer.write(
                            "train",
                            task=t,
                            step=global_end - (step - s),
                            task_step=s,
                            epoch=(s - 1) // plan.steps_per_epoch,
                            loss=float(m["loss"]),
                            alpha=float(m["alpha"]),
                            entropy=float(m["entropy"]),
                            lr=cfg.optim.learning_rate,
                            grad_norm=float(m["grad_norm"]),
                            images_per_s=ips,
                            train_peft=bool(m["train_peft"]),
                        )
                loss_now = host["loss"][:, logged[-1] - (step - k + 1)]
                bar.set_postfix(
                    loss=f"{float(np.mean(loss_now)):.3f}",
                    alpha=f"{float(host['alpha'][0, -1]):.3f}",
                )
            if every and step // every > (step - k) // every and step < plan.total_steps:
                self.check_finite(state, t)
                self.ckpt.save(
                    self.first(state.global_step),
                    state,
                    lwf,
                    self.meta(t, "in_task", step // plan.steps_per_epoch),
                )
        bar.close()
        self.check_finite(state, t)
        return state

    def _step_chunks(self, run_step, t, plan, state, lwf, step):
        """One jitted step per batch from the host loader; yields (state, step, 1, metrics)."""
        cfg, task = self.cfg, self.data.tasks.tasks[t]
        jit_step = jax.jit(run_step, donate_argnums=(0,))
        while step < plan.total_steps:
            epoch = step // plan.steps_per_epoch
            for batch in loader.iterate(
                self.data.train.images,
                self.data.tasks.train_labels,
                task.train_indices,
                cfg.optim.batch_size,
                self.mesh,
                train=True,
                seed=list(self.seeds) if self.vmapped else self.seeds[0],
                epoch=t * 100_000 + epoch,
                start=step - epoch * plan.steps_per_epoch,
            ):
                state, m = jit_step(state, self.frozen, lwf, batch)
                step += 1
                yield state, step, 1, m
                if step == plan.total_steps:
                    return

    def _scanned_chunks(self, run_step, t, plan, state, lwf, step):
        """`optim.steps_per_call` steps per call as one jitted `lax.scan`, the task's training
        data resident on the device; batches in the loader's order (per seed). Yields (state,
        step, k, metrics[[S,] k])."""
        cfg, task = self.cfg, self.data.tasks.tasks[t]
        batch_size, n = cfg.optim.batch_size, len(task.train_indices)
        images = jax.device_put(self.data.train.images[task.train_indices], self.replicated)
        labels = jax.device_put(
            self.data.tasks.train_labels[task.train_indices].astype(np.int32), self.replicated
        )
        sharded = (loader.seeds_batch_sharding if self.vmapped else loader.batch_sharding)(
            self.mesh
        )
        vmapped = self.vmapped

        def multi_step(state, frozen, lwf, images, labels, rows):
            def body(st, r):  # r: ([S,] B) rows of this step
                batch = jax.lax.with_sharding_constraint(
                    {"image": images[r], "label": labels[r]}, sharded
                )
                return run_step(st, frozen, lwf, batch)

            state, ms = jax.lax.scan(body, state, rows)  # metrics (k, [S])
            return state, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), ms) if vmapped else ms

        jit_multi = jax.jit(multi_step, donate_argnums=(0,))
        while step < plan.total_steps:
            epoch = step // plan.steps_per_epoch
            within = step - epoch * plan.steps_per_epoch
            k = min(
                cfg.optim.steps_per_call, plan.steps_per_epoch - within, plan.total_steps - step
            )
            rows = np.stack(
                [
                    loader.epoch_order(np.arange(n), seed, t * 100_000 + epoch)[
                        within * batch_size : (within + k) * batch_size
                    ].reshape(k, batch_size)
                    for seed in self.seeds
                ],
                axis=1,
            )  # (k, S, B)
            if not vmapped:
                rows = rows[:, 0]
            state, ms = jit_multi(
                state, self.frozen, lwf, images, labels, jnp.asarray(rows, jnp.int32)
            )
            step += k
            yield state, step, k, ms

    def finish_task(self, t: int, state: ts.TrainState) -> ts.TrainState:
        if self.lae and t == 0:
            peft, _ = partition.split(
                state.trainable, partition.label_params(state.trainable), (partition.PEFT,)
            )
            state = state.replace(offline_peft=jax.tree.map(jnp.copy, peft))
        results = self.evaluate(t, state)
        primary = self.predictors[0]
        step = self.first(state.global_step)
        a_t = []
        for result, tracker, writer in zip(results, self.trackers, self.writers, strict=True):
            a = tracker.matrix(primary)
            a_t.append(100.0 * metrics.incremental_accuracy(a, t))
            writer.write(
                {
                    "type": "eval",
                    "task": t,
                    "step": step,
                    "accuracy": {
                        p: [result["per_task"][i][p] for i in range(t + 1)] for p in self.predictors
                    },
                    "A_t": a_t[-1],
                    "acc_pooled": 100.0
                    * metrics.pooled_accuracy(tracker.correct[primary], tracker.total[primary], t),
                    "entropy": result["entropy"],
                }
            )
        if self.is_main:
            if self.vmapped:
                summary = (
                    f"{np.mean(a_t):.2f} +- {np.std(a_t, ddof=1):.2f}% over "
                    f"{len(a_t)} seeds ({primary})"
                )
            else:
                summary = f"{a_t[0]:.2f}% ({primary})"
            tqdm.tqdm.write(f"after task {t + 1}: A_t = {summary}")
        self.ckpt.save(step, state, None, self.meta(t, "task_done", 0))
        self.ckpt.wait()
        return state

    def restore(self) -> tuple[ts.TrainState | None, Params | None, int, int]:
        """(state, lwf, first task, first step) from the newest checkpoint, or a fresh start."""
        restored = self.ckpt.restore_latest(self.checkpoint_target)
        if restored is None:
            return None, None, 0, 0
        state, lwf, meta = restored
        state = jax.device_put(state, self.replicated)
        if meta["backbone_sha256"] != self.fingerprint:
            raise ValueError(
                "The frozen backbone differs from the one this run was checkpointed with "
                "(fingerprint mismatch): the weights file or pretraining changed. Use a new "
                "workdir, or restore the original weights."
            )
        if "seeds" not in meta or "trackers" not in meta:
            raise ValueError(
                f"The checkpoints in {self.ckpt.directory} were written by an older aepg_jax "
                "(no per-seed state); use a new workdir."
            )
        if meta["seeds"] != list(self.seeds):
            raise ValueError(
                f"The checkpoints in {self.ckpt.directory} hold seeds {meta['seeds']}, "
                f"this run trains {list(self.seeds)}; use a new workdir."
            )
        self.trackers = [metrics.AccuracyTracker.from_dict(d) for d in meta["trackers"]]
        self.elapsed_before = meta["elapsed_s"]
        if meta["phase"] == "task_done":
            start_task, start_step = meta["task"] + 1, 0
            lwf = state.trainable if self.lwf else None
        else:
            start_task, start_step = meta["task"], self.first(state.task_step)
        logging.info("Resuming at task %d, step %d.", start_task, start_step)
        if self.is_main:
            tqdm.tqdm.write(
                f"resuming from {self.ckpt.directory}: task {start_task + 1}, step {start_step}"
            )
        return state, lwf, start_task, start_step

    def report(self, wall: float) -> dict:
        """Writes results (per seed, plus the seeds' summary) and returns the run's results."""
        per_seed = [
            report.build_results(
                tracker, _seed_config(self.cfg, seed), wall, seed, list(self.head_sizes)
            )
            for tracker, seed in zip(self.trackers, self.seeds, strict=True)
        ]
        if self.is_main:
            for results, directory in zip(per_seed, self.seed_dirs, strict=True):
                report.write_results(directory, results)
                report.write_plots(
                    directory,
                    results,
                    report.read_metrics(os.path.join(directory, report.METRICS_FILE)),
                )
        if not self.vmapped:
            if self.is_main:
                print(report.final_table(per_seed[0]))
            return per_seed[0]
        summary = report.seeds_summary(per_seed, report.to_jsonable(self.cfg.to_dict()), wall)
        if self.is_main:
            report.write_results(self.workdir, summary, report.SEEDS_RESULTS_FILE)
            print(report.seeds_table(summary))
        return summary

    def run(self) -> dict:
        self.started = time.time()
        num_tasks = len(self.head_sizes)
        state, lwf, start_task, start_step = self.restore()
        for t in range(start_task, num_tasks):
            if start_step == 0:
                if state is None:
                    state = self.fresh_state(self.trainable_for(0), {}, 0)
                else:
                    state = self.fresh_state(
                        self.grow_heads(state.trainable, t),
                        state.offline_peft,
                        self.first(state.global_step),
                    )
            state = self.train_task(t, state, lwf, start_step)
            state = self.finish_task(t, state)
            if self.lwf:
                lwf = jax.tree.map(jnp.copy, state.trainable)
            start_step = 0
        self.ckpt.wait()
        return self.report(self.elapsed_before + time.time() - self.started)

    def close(self) -> None:
        self.ckpt.close()  # waits for a pending asynchronous save
        for writer in self.writers:
            writer.close()


def run(cfg: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs (or resumes) the continual experiment `cfg` in `workdir`; returns its results.

    One seed: results.json's dict. `num_seeds > 1`: the seeds' summary (results_seeds.json),
    each seed's own results.json being in `<workdir>/seed_<s>/`.
    """
    os.makedirs(workdir, exist_ok=True)
    runner = _Run(cfg, workdir)
    try:
        return runner.run()
    finally:
        runner.close()
