"""Supervised training from random initialisation (paper Table 4, Fig. 4; docs/algorithm.md §9).

`run(cfg, workdir)`: ResNet + SGD with momentum + step lr decay, the loss from the registry
(`mix` with `loss.alpha`, or any other; `aepg`'s alpha_t anneals over the whole run). Every
epoch: train, evaluate on the test split, log train/test accuracy and mean output entropy. An
epoch is `floor(N / batch_size)` steps: the last partial batch is dropped (static shapes), so
`N mod batch_size` random examples are skipped per epoch (CIFAR, 256: 80 of 50,000).

Devices: one 1-D mesh over all devices; batches are sharded over it, the state replicated, and
the step is a plain `jax.jit`: BatchNorm statistics are over the global batch (sync-BN), so any
device count gives the same result up to float reduction order. `num_seeds = S > 1`: the state
has a leading seed axis and the steps are `jax.vmap`-ed over it; seed i trains exactly as a
single run of seed `seed + i` (its own init, data order and augmentation).

Checkpoints (Orbax, `<workdir>/checkpoints/<step>/`) after every `checkpoint_every_epochs`
epochs and the last: parameters, BatchNorm statistics, SGD momentum, step, RNG, and the
per-epoch history. Inside an epoch, one every `checkpoint_every_minutes` of wall time and one at
the step a SIGTERM, SIGUSR1 or Ctrl-C arrived (then the run stops: `system/preemption.py`), each
with the epoch's running train sums (a signal at an epoch's last step is checkpointed before its
evaluation, which the resumed run does first). Re-running resumes after the newest one, with
identical results, and with each record of metrics.jsonl once (`records.MetricsWriter.rewind`).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm

from aepg_jax import losses, schedules
from aepg_jax.config import schema
from aepg_jax.data import loader
from aepg_jax.models import resnet
from aepg_jax.runs import checkpointing, records
from aepg_jax.runs import seeds as seeds_lib
from aepg_jax.scratch import config as scratch_config
from aepg_jax.scratch import data as scratch_data
from aepg_jax.scratch import results as scratch_results
from aepg_jax.scratch import train_step as ts
from aepg_jax.system import environment, preemption, progress


def steps_per_epoch(num_examples: int, cfg: ml_collections.ConfigDict) -> int:
    """`floor(N / batch_size)` (last partial batch dropped), capped by `max_steps_per_epoch`."""
    steps = loader.num_batches(num_examples, cfg.optim.batch_size, drop_last=True)
    if steps == 0:
        raise ValueError(
            f"The training split has {num_examples} examples, fewer than "
            f"optim.batch_size={cfg.optim.batch_size}; lower optim.batch_size."
        )
    return min(steps, cfg.max_steps_per_epoch or steps)


class _Run:
    """State and bookkeeping of one `run` call (the jitted functions stay pure)."""

    def __init__(self, cfg: ml_collections.ConfigDict, workdir: str):
        self.cfg, self.workdir = cfg, workdir
        self.mesh = loader.data_mesh()
        scratch_config.validate(cfg, self.mesh.devices.size)
        self.is_main = jax.process_index() == 0
        self.data = scratch_data.prepare_data(cfg)
        self.seeds = tuple(cfg.seed + i for i in range(cfg.num_seeds))
        self.axis = seeds_lib.SeedAxis(self.seeds)
        self.vmapped = self.axis.vmapped
        self.replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        self.model = resnet.build(scratch_config.resnet_spec(cfg), self.data.num_classes)
        self.steps_per_epoch = steps_per_epoch(len(self.data.train_indices), cfg)
        self.total_steps = cfg.optim.epochs * self.steps_per_epoch
        o = cfg.optim
        self.tx, self.lr_schedule = ts.make_optimizer(
            o.learning_rate,
            o.momentum,
            o.nesterov,
            o.weight_decay,
            tuple(o.milestones),
            o.lr_decay,
            self.steps_per_epoch,
        )
        self.annealed = losses.is_annealed(cfg.loss.name)
        self.fixed_alpha = losses.fixed_alpha(cfg.loss.name, **schema.loss_kwargs(cfg))
        step = ts.make_train_step(
            self.model.apply,
            losses.get_loss(cfg.loss.name, **schema.loss_kwargs(cfg)),
            self.annealed,
            schedules.get_schedule(
                cfg.schedule.name, self.total_steps, **schema.schedule_kwargs(cfg)
            ),
            self.tx,
            self.lr_schedule,
            ts.AugmentConfig(cfg.data.pad, cfg.data.flip_prob, self.data.mean, self.data.std),
        )
        self.train_step = jax.jit(self.axis.lift(step, (0, 0)), donate_argnums=(0,))
        evaluate = ts.make_eval_step(self.model.apply, self.data.mean, self.data.std)
        self.eval_step = jax.jit(self.axis.lift(evaluate, (0, 0, None)))
        self.ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"))
        self.seed_dirs = records.seed_dirs(workdir, self.seeds)
        self.writers = records.open_writers(cfg, self.seed_dirs, enabled=self.is_main)
        self.history: list[list[dict[str, float]]] = [[] for _ in self.seeds]
        self.elapsed_before = 0.0

    # -- the seed axis -------------------------------------------------------------------------

    def per_seed(self, x: Any) -> np.ndarray:
        """Host copy of a per-seed scalar as float64: shape (S,)."""
        return self.axis.per_seed(x).astype(np.float64)

    def init_state(self) -> ts.TrainState:
        """Fresh per-seed state: init from fold_in(key, 0), step keys from fold_in(key, 1)."""
        keys = jnp.stack([jax.random.PRNGKey(s) for s in self.seeds])
        variables = resnet.init_seeds(
            self.model, jax.vmap(jax.random.fold_in, (0, None))(keys, 0), self.cfg.data.image_size
        )
        state = jax.vmap(
            lambda params, stats, key: ts.TrainState(
                params=params,
                batch_stats=stats,
                opt_state=self.tx.init(params),
                step=jnp.zeros([], jnp.int32),
                rng=jax.random.fold_in(key, 1),
            )
        )(variables["params"], variables["batch_stats"], keys)
        if not self.vmapped:
            state = jax.tree.map(lambda x: x[0], state)
        # Copies: the train step donates its state.
        return jax.device_put(jax.tree.map(jnp.copy, state), self.replicated)

    # -- one epoch -----------------------------------------------------------------------------

    def train_epoch(
        self, state: ts.TrainState, epoch: int, start: int = 0, sums: dict | None = None
    ) -> tuple[ts.TrainState, dict]:
        """Trains one epoch from step `start` (with the train `sums` of steps before it);
        returns the state and per-seed (S,) train loss, acc %, entropy. Checkpoints inside
        the epoch on the wall-clock interval, and on a stop signal (then raises `Preempted`)."""
        cfg, n = self.cfg, self.steps_per_epoch
        batches = loader.iterate(
            self.data.train.images,
            self.data.train.labels,
            self.data.train_indices,
            cfg.optim.batch_size,
            self.mesh,
            train=True,
            seed=list(self.seeds) if self.vmapped else self.seeds[0],
            epoch=epoch,
            start=start,
        )
        last_log, last_time = start, time.time()
        bar = progress.bar(
            n,
            initial=start,
            desc=f"epoch {epoch + 1}/{cfg.optim.epochs}",
            unit="step",
            leave=False,
            disable=not self.is_main,
        )
        for i, batch in zip(range(start, n), batches, strict=False):  # n may cap the epoch
            state, m = self.train_step(state, batch)
            keep = {k: m[k] for k in ("loss", "correct", "entropy_sum")}
            sums = keep if sums is None else jax.tree.map(jnp.add, sums, keep)
            if i == start:  # the first call may compile: the bar's clock starts after it
                jax.block_until_ready(m)
                progress.started(bar, start + 1)
            else:
                bar.update(1)
            step = epoch * n + i + 1
            progress.at(epoch=f"{epoch + 1}/{cfg.optim.epochs}", step=f"{i + 1}/{n}")
            if step % cfg.log_every_steps == 0 or i == n - 1:
                now = time.time()
                ips = (i + 1 - last_log) * cfg.optim.batch_size / max(now - last_time, 1e-9)
                last_log, last_time = i + 1, now
                host = {k: self.per_seed(m[k]) for k in ("loss", "alpha", "lr")}
                if not self.annealed:  # log alpha only where the loss uses one
                    host.pop("alpha")
                    if self.fixed_alpha is not None:
                        host["alpha"] = np.full(len(self.seeds), self.fixed_alpha)
                for s, writer in enumerate(self.writers):
                    writer.write(
                        "train", step=step, epoch=epoch, images_per_s=ips,
                        **{k: float(v[s]) for k, v in host.items()},
                    )  # fmt: skip
                bar.set_postfix(loss=f"{np.mean(host['loss']):.3f}", lr=f"{host['lr'][0]:.3g}")
            self.checkpoint_in_epoch(state, epoch, i + 1, sums, bar)
        bar.close()
        batches.close()
        examples = n * cfg.optim.batch_size
        host = {k: self.per_seed(v) for k, v in sums.items()}
        return state, {
            "train_loss": host["loss"] / n,
            "train_acc": 100.0 * host["correct"] / examples,
            "train_entropy": host["entropy_sum"] / examples,
        }

    def evaluate(self, state: ts.TrainState) -> dict[str, np.ndarray]:
        """Per-seed (S,) test accuracy (%) and mean entropy over the whole test split."""
        test = self.data.test
        sums = None
        for batch in loader.iterate(
            test.images,
            test.labels,
            np.arange(len(test)),
            self.cfg.eval.batch_size,
            self.mesh,
            train=False,
        ):
            out = self.eval_step(state.params, state.batch_stats, batch)
            sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
        host = {k: self.per_seed(v) for k, v in sums.items()}
        return {
            "test_acc": 100.0 * host["correct"] / host["count"],
            "test_entropy": host["entropy_sum"] / host["count"],
        }

    # -- checkpoints ---------------------------------------------------------------------------

    def meta(self, epochs_done: int, in_epoch: dict | None = None) -> dict[str, Any]:
        """What a checkpoint stores beside the state; `in_epoch`: `{"step", "sums"}` of a
        checkpoint inside epoch `epochs_done` (0-based), else None."""
        return {
            "epochs_done": epochs_done,
            "in_epoch": in_epoch,
            "seeds": list(self.seeds),
            "history": self.history,
            "elapsed_s": self.elapsed_before + time.time() - self.started,
        }

    def resume_point(self, epochs_done: int, step: int = 0) -> str:
        """What the same command does from a checkpoint at `step` of epoch `epochs_done`
        (0-based), in words, for the line a second Ctrl-C prints (`system/progress.py`)."""
        epochs = self.cfg.optim.epochs
        if epochs_done >= epochs:
            return "the run is finished"
        if step == 0:
            return f"it resumes at the start of epoch {epochs_done + 1}/{epochs}"
        return f"it resumes at epoch {epochs_done + 1}/{epochs}, step {step}/{self.steps_per_epoch}"

    def save(self, state: ts.TrainState, epochs_done: int) -> None:
        step = epochs_done * self.steps_per_epoch
        self.ckpt.save(
            step, {"state": state}, self.meta(epochs_done), self.resume_point(epochs_done)
        )
        self.last_save = time.monotonic()

    def checkpoint_in_epoch(self, state, epoch: int, step: int, sums: dict, bar) -> None:
        """After step `step` of `epoch`: a checkpoint when the wall-clock interval has passed
        (not at the epoch's last step: its own checkpoint follows the evaluation) or a stop
        signal arrived; on a signal, `Preempted` once written."""
        minutes = self.cfg.checkpoint_every_minutes
        last = step == self.steps_per_epoch
        timed = not last and minutes > 0 and time.monotonic() - self.last_save >= 60.0 * minutes
        signum, timed = preemption.agree(timed)
        if not (signum or timed):
            return
        host = {k: np.asarray(jax.device_get(v)) for k, v in sums.items()}
        in_epoch = {
            "step": step,
            "sums": {k: {"dtype": str(v.dtype), "values": v.tolist()} for k, v in host.items()},
        }
        global_step = epoch * self.steps_per_epoch + step
        items, meta = {"state": state}, self.meta(epoch, in_epoch)
        resumes = self.resume_point(epoch, step)
        if signum:
            bar.close()
            where = (
                f"at epoch {epoch + 1}/{self.cfg.optim.epochs}, step {step}/{self.steps_per_epoch}"
            )
            preemption.save_and_stop(signum, self.ckpt, global_step, items, meta, where, resumes)
        self.ckpt.save(global_step, items, meta, resumes)
        self.last_save = time.monotonic()

    def restore(self) -> tuple[ts.TrainState, int, int, dict | None]:
        """(state, epochs done, step within the next epoch, its train sums so far) of the
        newest checkpoint, or a fresh state, 0, 0 and None."""
        fresh = self.init_state()
        restored = self.ckpt.restore_latest(lambda meta: {"state": fresh})
        if restored is None:
            for writer in self.writers:  # a run killed before its first checkpoint starts again
                writer.rewind(records.Cut(0))
            return fresh, 0, 0, None
        items, meta = restored
        state = items["state"]
        if meta["seeds"] != list(self.seeds):
            raise ValueError(
                f"The checkpoints in {self.ckpt.directory} hold seeds {meta['seeds']}, this run "
                f"trains {list(self.seeds)}; use a new workdir."
            )
        self.history = meta["history"]
        self.elapsed_before = meta["elapsed_s"]
        in_epoch = meta.get("in_epoch")
        step, sums = 0, None
        if in_epoch:
            step = in_epoch["step"]
            sums = {
                k: jax.device_put(np.asarray(v["values"], v["dtype"]), self.replicated)
                for k, v in in_epoch["sums"].items()
            }
        # What the stopped process recorded after this checkpoint is recorded again from here.
        cut = records.Cut(meta["epochs_done"] * self.steps_per_epoch + step, closed=not in_epoch)
        for writer in self.writers:
            writer.rewind(cut)
        self.ckpt.restored(self.resume_point(meta["epochs_done"], step))
        if self.is_main:
            where = f", step {step}" if in_epoch else ""
            tqdm.tqdm.write(
                f"resuming from {self.ckpt.directory} after epoch {meta['epochs_done']}{where}"
            )
        return jax.device_put(state, self.replicated), meta["epochs_done"], step, sums

    # -- the run -------------------------------------------------------------------------------

    def record_epoch(self, epoch: int, train: dict, test: dict) -> None:
        """Appends the epoch to each seed's history and metrics.jsonl; raises on a NaN loss
        or a diverged one (`diverged`)."""
        loss = np.asarray(train["train_loss"], np.float64)
        bad = diverged(loss, self.data.num_classes)
        if bad.any():
            i, c = int(np.argmax(bad)), self.data.num_classes
            where = f"in epoch {epoch + 1} (seed {self.seeds[i]})"
            what = (
                f"Non-finite training loss {where}."
                if not np.isfinite(loss[i])
                else f"Training diverged {where}: loss {loss[i]:.3g}, over "
                f"{DIVERGED_FACTOR:.0f} ln({c}) = {DIVERGED_FACTOR * math.log(c):.0f}."
            )
            raise FloatingPointError(
                f"{what} Lower optim.learning_rate or check the data and loss settings."
            )
        step = (epoch + 1) * self.steps_per_epoch
        lr = float(self.lr_schedule(step - 1))
        for s, writer in enumerate(self.writers):
            row = {"epoch": epoch, **{k: float(v[s]) for k, v in (train | test).items()}}
            self.history[s].append(row)
            writer.write("epoch", step=step, lr=lr, **row)
        if self.is_main:
            tqdm.tqdm.write(
                f"epoch {epoch + 1}: test acc "
                + " ".join(f"{v:.2f}" for v in test["test_acc"])
                + "%, test entropy "
                + " ".join(f"{v:.3f}" for v in test["test_entropy"])
            )

    def run(self) -> dict[str, Any]:
        self.started, self.last_save = time.time(), time.monotonic()
        state, done, start, sums = self.restore()
        epochs = self.cfg.optim.epochs
        for epoch in range(done, epochs):
            state, train = self.train_epoch(state, epoch, start, sums)
            start, sums = 0, None
            self.record_epoch(epoch, train, self.evaluate(state))
            signum, _ = preemption.agree(False)
            if signum and epoch + 1 < epochs:  # during the evaluation: stop after its epoch
                step = (epoch + 1) * self.steps_per_epoch
                where = f"after epoch {epoch + 1}/{epochs}"
                meta, resumes = self.meta(epoch + 1), self.resume_point(epoch + 1)
                preemption.save_and_stop(
                    signum, self.ckpt, step, {"state": state}, meta, where, resumes
                )
            if (epoch + 1) % self.cfg.checkpoint_every_epochs == 0 or epoch + 1 == epochs:
                self.save(state, epoch + 1)
        self.ckpt.wait()
        finished = done >= epochs  # before this process: its results files stay as written
        return self.report(self.elapsed_before + time.time() - self.started, finished)

    def report(self, wall: float, finished: bool = False) -> dict[str, Any]:
        """Writes each seed's results.json and curves.png (and results_seeds.json); a run
        `finished` before this process keeps its results files (`records.kept_results`)."""
        write = records.kept_results if finished else records.write_results
        extra = {
            "dataset": self.data.name,
            "num_classes": self.data.num_classes,
            "num_params": resnet.count_params(
                scratch_config.resnet_spec(self.cfg),
                self.data.num_classes,
                self.cfg.data.image_size,
            ),
            "steps_per_epoch": self.steps_per_epoch,
            "num_devices": int(self.mesh.devices.size),
            "train_examples": len(self.data.train_indices),
            "normalization": {"mean": self.data.mean, "std": self.data.std},
            "environment": environment.describe(),  # single seeds differ between machines
        }
        per_seed = [
            scratch_results.build_results(h, records.seed_config(self.cfg, s), s, extra, wall)
            for h, s in zip(self.history, self.seeds, strict=True)
        ]
        if self.is_main:
            for i, directory in enumerate(self.seed_dirs):
                kept = write(directory, per_seed[i])
                per_seed[i] = results = kept if finished else per_seed[i]
                scratch_results.plot_curves(
                    results, os.path.join(directory, scratch_results.PLOT_FILE)
                )
                print(scratch_results.summary_line(results))
        if not self.vmapped:
            return per_seed[0]
        config = records.to_jsonable(self.cfg.to_dict())
        summary = scratch_results.seeds_summary(per_seed, config, wall)
        if self.is_main:
            kept = write(self.workdir, summary, records.SEEDS_RESULTS_FILE)
            summary = kept if finished else summary
        return summary

    def close(self) -> None:
        self.ckpt.close()
        for writer in self.writers:
            writer.close()


# An epoch's mean training loss above this many times chance-level cross-entropy ln(C) means
# the run diverged (every loss here is of the order of ln(C) or below for any sane model).
DIVERGED_FACTOR = 100.0


def diverged(train_loss: np.ndarray, num_classes: int) -> np.ndarray:
    """Per seed: the loss is not finite, or above `DIVERGED_FACTOR * ln(num_classes)`."""
    limit = DIVERGED_FACTOR * math.log(max(num_classes, 2))
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(train_loss) | (train_loss > limit)


def run(cfg: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Runs (or resumes) the from-scratch experiment `cfg` in `workdir`; returns its results:
    results.json's dict for one seed, results_seeds.json's for `num_seeds > 1`."""
    os.makedirs(workdir, exist_ok=True)
    if jax.process_index() == 0:  # the writing process refuses before any data work
        checkpointing.check_writable(os.path.join(workdir, "checkpoints"))
    runner = _Run(cfg, workdir)
    try:
        return runner.run()
    except KeyboardInterrupt:  # a second Ctrl-C (system/preemption.py)
        progress.resumes(runner.ckpt.on_disk())  # said by aepg_jax.main
        runner.ckpt.abandon()  # the process ends at once (checkpointing.Checkpointer.abandon)
        raise
    finally:
        runner.close()
