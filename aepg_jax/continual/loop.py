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


class _Run:
    """The mutable bookkeeping of one `run` call (kept out of the jitted functions)."""

    def __init__(self, cfg: ml_collections.ConfigDict, workdir: str):
        self.cfg, self.workdir = cfg, workdir
        self.mesh = loader.data_mesh()
        config_lib.validate(cfg, self.mesh.devices.size)
        self.is_main = jax.process_index() == 0
        self.data = prepare_data(cfg)
        self.key = jax.random.PRNGKey(cfg.seed)
        params = initial_params(cfg, self.key, self.mesh)
        labels = partition.label_params(params)
        self.replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        peft, frozen = partition.split(params, labels, partition.TRAINABLE)
        self.frozen = jax.device_put(frozen, self.replicated)
        self.initial_peft = peft
        self.fingerprint = checkpointing.backbone_fingerprint(frozen)
        self.ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"))
        self.writer = report.MetricsWriter(workdir, enabled=self.is_main)
        self.predictors = predictors(cfg)
        self.tracker = metrics.AccuracyTracker(cfg.data.num_tasks, self.predictors)
        self.head_sizes = self.data.tasks.head_sizes
        self.lae = cfg.method.name == "lae"
        self.lwf = cfg.method.name == "lwf"
        self.step_cfg = step_config(cfg)
        self.loss_fn = losses.get_loss(cfg.loss.name, **config_lib.loss_kwargs(cfg))
        self.annealed = losses.is_annealed(cfg.loss.name)
        self.elapsed_before = 0.0

    # -- state construction ------------------------------------------------------------------

    def trainable_for(self, task: int) -> Params:
        """Initial PEFT plus freshly grown heads of tasks 0..task (deterministic per seed)."""
        trainable = self.initial_peft
        for t in range(task + 1):
            trainable = head.grow(
                trainable,
                jax.random.fold_in(self.key, 1000 + t),
                self.head_sizes[t],
                self.cfg.model.hidden_size,
            )
        return trainable

    def fresh_state(self, trainable: Params, offline: Params, global_step: int) -> ts.TrainState:
        state = ts.TrainState(
            trainable=trainable,
            opt_state=_optimizer(self.cfg, trainable).init(trainable),
            offline_peft=offline,
            task_step=jnp.zeros([], jnp.int32),
            global_step=jnp.asarray(global_step, jnp.int32),
            rng=jax.random.fold_in(self.key, 7),
            first_bad_step=jnp.asarray(-1, jnp.int32),
        )
        # Copies: the train step donates its state, which must never alias `initial_peft`.
        state = jax.tree.map(lambda x: jnp.array(x, copy=True), state)
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
            "tracker": self.tracker.to_dict(),
            "head_sizes": list(self.head_sizes[: task + 1]),
            "backbone_sha256": self.fingerprint,
            "elapsed_s": self.elapsed_before + time.time() - self.started,
        }

    # -- checks --------------------------------------------------------------------------------

    def check_finite(self, state: ts.TrainState, task: int) -> None:
        bad = int(state.first_bad_step)
        if bad >= 0:
            steps = self.ckpt.steps()
            last = (
                f"checkpoint {steps[-1]} in {self.ckpt.directory}"
                if steps
                else "none (no checkpoint yet)"
            )
            raise FloatingPointError(
                f"Non-finite loss in task {task} at global step {bad}. Last good checkpoint: "
                f"{last}. Lower optim.learning_rate or check the data and loss settings."
            )

    # -- evaluation ----------------------------------------------------------------------------

    def evaluate(self, task: int, state: ts.TrainState) -> dict:
        """Accuracy of every predictor on every seen task; records it in the tracker."""
        apply_fn = _apply_fn(self.cfg, self.head_sizes[: task + 1])
        num_seen = self.data.tasks.tasks[task].stop
        eval_fn = jax.jit(ts.make_eval_step(apply_fn, num_seen, self.lae, self.step_cfg))
        online = partition.merge(state.trainable, self.frozen)
        offline = None
        if self.lae:
            heads, _ = partition.split(
                state.trainable, partition.label_params(state.trainable), (partition.HEAD,)
            )
            offline = partition.merge(state.offline_peft, heads, self.frozen)
        entropy_sum, count_all = 0.0, 0
        per_task = {}
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
                out = eval_fn(online, offline, batch)
                sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
            sums = jax.device_get(sums)
            count = int(sums["count"])
            for p in self.predictors:
                self.tracker.record(task, p, i, int(sums[p]), count)
            per_task[i] = {p: 100.0 * int(sums[p]) / max(count, 1) for p in self.predictors}
            entropy_sum += float(sums["entropy_sum"])
            count_all += count
        entropy = entropy_sum / max(count_all, 1)
        self.tracker.record_entropy(task, entropy)
        return {"per_task": per_task, "entropy": entropy}

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
        step_fn = ts.make_train_step(
            _apply_fn(cfg, self.head_sizes[: t + 1]),
            self.loss_fn,
            self.annealed,
            schedule,
            _optimizer(cfg, state.trainable),
            partition.label_params(state.trainable),
            spec,
            self.step_cfg,
            _apply_fn(cfg, self.head_sizes[:t]) if (self.lwf and t >= 1) else None,
        )
        lwf_params = partition.merge(lwf, self.frozen) if lwf is not None else None
        chunks = (self._scanned_chunks if cfg.optim.steps_per_call > 1 else self._step_chunks)(
            step_fn, t, plan, state, lwf_params, start_step
        )
        bar = tqdm.tqdm(
            total=plan.total_steps,
            initial=start_step,
            unit="step",
            desc=f"task {t + 1}/{len(self.head_sizes)}",
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
                host = jax.device_get(metrics_chunk)  # one host sync per logged chunk
                host = {key: np.reshape(value, (k,)) for key, value in host.items()}
                now = time.time()
                ips = (step - last_log) * cfg.optim.batch_size / max(now - last_time, 1e-9)
                last_log, last_time = step, now
                global_end = int(state.global_step)
                for s in logged:
                    m = {key: value[s - (step - k + 1)] for key, value in host.items()}
                    self.writer.write(
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
                bar.set_postfix(loss=f"{float(m['loss']):.3f}", alpha=f"{float(m['alpha']):.3f}")
            if every and step // every > (step - k) // every and step < plan.total_steps:
                self.check_finite(state, t)
                self.ckpt.save(
                    int(state.global_step),
                    state,
                    lwf,
                    self.meta(t, "in_task", step // plan.steps_per_epoch),
                )
        bar.close()
        self.check_finite(state, t)
        return state

    def _step_chunks(self, step_fn, t, plan, state, lwf_params, step):
        """One jitted step per batch from the host loader; yields (state, step, 1, metrics)."""
        cfg, task = self.cfg, self.data.tasks.tasks[t]
        jit_step = jax.jit(step_fn, donate_argnums=(0,))
        while step < plan.total_steps:
            epoch = step // plan.steps_per_epoch
            for batch in loader.iterate(
                self.data.train.images,
                self.data.tasks.train_labels,
                task.train_indices,
                cfg.optim.batch_size,
                self.mesh,
                train=True,
                seed=cfg.seed,
                epoch=t * 100_000 + epoch,
                start=step - epoch * plan.steps_per_epoch,
            ):
                state, m = jit_step(state, self.frozen, lwf_params, batch)
                step += 1
                yield state, step, 1, m
                if step == plan.total_steps:
                    return

    def _scanned_chunks(self, step_fn, t, plan, state, lwf_params, step):
        """`optim.steps_per_call` steps per call as one jitted `lax.scan`, the task's training
        data resident on the device; batches in the loader's order. Yields (state, step, k,
        metrics[k])."""
        cfg, task = self.cfg, self.data.tasks.tasks[t]
        batch_size, n = cfg.optim.batch_size, len(task.train_indices)
        images = jax.device_put(self.data.train.images[task.train_indices], self.replicated)
        labels = jax.device_put(
            self.data.tasks.train_labels[task.train_indices].astype(np.int32), self.replicated
        )
        sharded = loader.batch_sharding(self.mesh)

        def multi_step(state, frozen, lwf_params, images, labels, rows):
            def body(st, r):
                batch = jax.lax.with_sharding_constraint(
                    {"image": images[r], "label": labels[r]}, sharded
                )
                return step_fn(st, frozen, lwf_params, batch)

            return jax.lax.scan(body, state, rows)

        jit_multi = jax.jit(multi_step, donate_argnums=(0,))
        while step < plan.total_steps:
            epoch = step // plan.steps_per_epoch
            within = step - epoch * plan.steps_per_epoch
            k = min(
                cfg.optim.steps_per_call, plan.steps_per_epoch - within, plan.total_steps - step
            )
            order = loader.epoch_order(np.arange(n), cfg.seed, t * 100_000 + epoch)
            rows = order[within * batch_size : (within + k) * batch_size].reshape(k, batch_size)
            state, ms = jit_multi(
                state, self.frozen, lwf_params, images, labels, jnp.asarray(rows, jnp.int32)
            )
            step += k
            yield state, step, k, ms

    def finish_task(self, t: int, state: ts.TrainState) -> ts.TrainState:
        if self.lae and t == 0:
            peft, _ = partition.split(
                state.trainable, partition.label_params(state.trainable), (partition.PEFT,)
            )
            state = state.replace(offline_peft=jax.tree.map(jnp.copy, peft))
        result = self.evaluate(t, state)
        primary = self.predictors[0]
        a = self.tracker.matrix(primary)
        self.writer.write(
            {
                "type": "eval",
                "task": t,
                "step": int(state.global_step),
                "accuracy": {
                    p: [result["per_task"][i][p] for i in range(t + 1)] for p in self.predictors
                },
                "A_t": 100.0 * metrics.incremental_accuracy(a, t),
                "acc_pooled": 100.0
                * metrics.pooled_accuracy(
                    self.tracker.correct[primary], self.tracker.total[primary], t
                ),
                "entropy": result["entropy"],
            }
        )
        if self.is_main:
            tqdm.tqdm.write(
                f"after task {t + 1}: A_t = "
                f"{100 * metrics.incremental_accuracy(a, t):.2f}% ({primary})"
            )
        self.ckpt.save(int(state.global_step), state, None, self.meta(t, "task_done", 0))
        self.ckpt.wait()
        return state

    def run(self) -> dict:
        self.started = time.time()
        num_tasks = len(self.head_sizes)
        restored = self.ckpt.restore_latest(self.checkpoint_target)
        state, lwf, start_task, start_step = None, None, 0, 0
        if restored is not None:
            state, lwf, meta = restored
            state = jax.device_put(state, self.replicated)
            if meta["backbone_sha256"] != self.fingerprint:
                raise ValueError(
                    "The frozen backbone differs from the one this run was checkpointed with "
                    "(fingerprint mismatch): the weights file or pretraining changed. Use a new "
                    "workdir, or restore the original weights."
                )
            self.tracker = metrics.AccuracyTracker.from_dict(meta["tracker"])
            self.elapsed_before = meta["elapsed_s"]
            if meta["phase"] == "task_done":
                start_task = meta["task"] + 1
                lwf = state.trainable if self.lwf else None
            else:
                start_task, start_step = meta["task"], int(state.task_step)
            logging.info("Resuming at task %d, step %d.", start_task, start_step)
            if self.is_main:
                tqdm.tqdm.write(
                    f"resuming from {self.ckpt.directory}: task {start_task + 1}, step {start_step}"
                )
        for t in range(start_task, num_tasks):
            if start_step == 0:
                global_step = int(state.global_step) if state is not None else 0
                if state is None:
                    trainable = self.trainable_for(0)
                    offline = {}
                else:
                    trainable = head.grow(
                        state.trainable,
                        jax.random.fold_in(self.key, 1000 + t),
                        self.head_sizes[t],
                        self.cfg.model.hidden_size,
                    )
                    offline = state.offline_peft
                state = self.fresh_state(trainable, offline, global_step)
            state = self.train_task(t, state, lwf, start_step)
            state = self.finish_task(t, state)
            if self.lwf:
                lwf = jax.tree.map(jnp.copy, state.trainable)
            start_step = 0
        self.ckpt.wait()
        wall = self.elapsed_before + time.time() - self.started
        results = report.build_results(
            self.tracker, self.cfg.to_dict(), wall, self.cfg.seed, list(self.head_sizes)
        )
        if self.is_main:
            report.write_results(self.workdir, results)
            report.write_plots(
                self.workdir,
                results,
                report.read_metrics(os.path.join(self.workdir, "metrics.jsonl")),
            )
            print(report.final_table(results))
        return results


def run(cfg: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs (or resumes) the continual experiment `cfg` in `workdir`; returns results.json."""
    os.makedirs(workdir, exist_ok=True)
    runner = _Run(cfg, workdir)
    try:
        return runner.run()
    finally:
        runner.ckpt.close()  # waits for a pending asynchronous save
        runner.writer.close()
