"""Simulates a sweep of an experiment on N GPUs from the analytic cost estimate: the makespan of
static shards (`--shard=i/N`: every N-th run) against N workers claiming runs most expensive
first (`aepg_jax.sweep` without --shard), and their ratio.

    python benchmarks/simulate_sweep_schedule.py [--experiment=table1] [--gpus=8] [--where=k=v,...]

A run's time is taken as proportional to its estimated FLOPs (`aepg_jax/plan/estimate.py`),
i.e. every run at the same throughput; compile, data loading and start-up are not counted.
The workers' schedule is list scheduling: each free worker takes the most expensive run left.
"""

from __future__ import annotations

import argparse
import heapq
import sys

from aepg_jax import experiments
from aepg_jax.experiments import layout, registry
from aepg_jax.sweep import preflight


def static_makespan(costs: list[float], gpus: int) -> float:
    """The longest shard of `--shard=i/gpus` (every gpus-th run from the i-th)."""
    return max(sum(costs[i::gpus]) for i in range(gpus))


def workers_makespan(costs: list[float], gpus: int) -> float:
    """The end of the last run when each free worker claims the most expensive run left."""
    free = [0.0] * gpus
    for cost in sorted(costs, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + cost)
    return max(free)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--experiment", default="table1")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--where", help="only these runs, as aepg_jax.sweep --where")
    args = parser.parse_args(argv)
    runs = experiments.filter_runs(registry.get(args.experiment).runs(), args.where)
    units = layout.units(runs)
    cost = preflight.costs(preflight.check(units, ()))
    costs = [cost[u.name] for u in units if cost[u.name] > 0]  # in the experiment's order
    if not costs:
        print(f"error: no run of {args.experiment} has a cost estimate.", file=sys.stderr)
        return 2
    if len(costs) < len(units):  # e.g. folder datasets, whose size is not known in advance
        print(f"left out: {len(units) - len(costs)} runs without a cost estimate")
    scale = 1e18  # EFLOP
    static = static_makespan(costs, args.gpus)
    workers = workers_makespan(costs, args.gpus)
    bound = max(sum(costs) / args.gpus, max(costs))
    print(f"{args.experiment}: {len(costs)} runs, {sum(costs) / scale:.2f} EFLOP in all, "
          f"runs {min(costs) / scale:.4f}..{max(costs) / scale:.4f} EFLOP")  # fmt: skip
    print(f"{args.gpus} GPUs, makespan in EFLOP per GPU (lower bound {bound / scale:.3f}):")
    print(f"  static shards (--shard=i/{args.gpus}):       {static / scale:.3f}")
    print(f"  workers, most expensive first:    {workers / scale:.3f}")
    print(f"  ratio static / workers:           {static / workers:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
