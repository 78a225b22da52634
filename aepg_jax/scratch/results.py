"""What a from-scratch run writes: results.json per seed, results_seeds.json, the curves plot.

`metrics.jsonl` (written by the trainer through `MetricsWriter`) holds `"train"` records every
`log_every_steps` (`step, epoch, loss, [alpha,] lr, images_per_s`; `alpha` only for a loss that
uses one: aEPG's alpha_t, or `mix`'s constant) and one `"epoch"` record per epoch (`step, epoch`
(0-based), `train_loss, train_acc, train_entropy, test_acc, test_entropy, lr`; accuracies in %,
entropies in nats). Train accuracy and entropy are the means over
the epoch's training batches as the train step saw them (augmented, BatchNorm in train mode);
test ones are on the whole test split in eval mode.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from aepg_jax.runs import records

CURVES = ("train_loss", "train_acc", "train_entropy", "test_acc", "test_entropy")
SUMMARY = ("final_test_acc", "best_test_acc", "final_test_entropy", "final_train_acc")
PLOT_FILE = "curves.png"


def build_results(
    history: Sequence[Mapping[str, Any]],
    config: Mapping[str, Any],
    seed: int,
    extra: Mapping[str, Any],
    wall_time_s: float,
) -> dict[str, Any]:
    """results.json of one seed: per-epoch curves (`CURVES`, lists over epochs 1..E), the
    `SUMMARY` numbers, `config`, `seed`, `wall_time_s` and `extra` (dataset facts)."""
    curves = {k: [float(h[k]) for h in history] for k in CURVES}
    test = curves["test_acc"]
    return {
        "config": dict(config),
        "seed": int(seed),
        **dict(extra),
        "epochs": [int(h["epoch"]) + 1 for h in history],
        **curves,
        "final_test_acc": test[-1] if test else None,
        "best_test_acc": max(test) if test else None,
        "final_test_entropy": curves["test_entropy"][-1] if test else None,
        "final_train_acc": curves["train_acc"][-1] if test else None,
        "wall_time_s": float(wall_time_s),
    }


def seeds_summary(
    per_seed: Sequence[Mapping[str, Any]], config: Mapping[str, Any], wall_time_s: float
) -> dict[str, Any]:
    """results_seeds.json (`records.seeds_summary`): `SUMMARY` metrics as {mean, std (ddof=1),
    values} over seeds, the per-epoch mean curves (`mean_curves`), and every seed's results."""
    return records.seeds_summary(
        per_seed,
        config,
        wall_time_s,
        {k: records.mean_std([r[k] for r in per_seed]) for k in SUMMARY},
        mean_curves={k: np.mean([r[k] for r in per_seed], axis=0).tolist() for k in CURVES},
    )


def summary_line(results: Mapping[str, Any]) -> str:
    """`final test acc / entropy` of one seed's results, for the terminal."""
    return (
        f"seed {results['seed']}: test acc {results['final_test_acc']:.2f}% "
        f"(best {results['best_test_acc']:.2f}%), test entropy "
        f"{results['final_test_entropy']:.3f}, train acc {results['final_train_acc']:.2f}%, "
        f"{results['wall_time_s']:.0f} s"
    )


def plot_curves(results: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Test (solid) and train (dashed) accuracy and entropy per epoch (the paper's Fig. 4)."""
    epochs = results["epochs"]
    fig, (ax_a, ax_h) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_a.plot(epochs, results["test_acc"], label="test")
    ax_a.plot(epochs, results["train_acc"], "--", label="train (augmented)")
    ax_h.plot(epochs, results["test_entropy"], label="test")
    ax_h.plot(epochs, results["train_entropy"], "--", label="train (augmented)")
    ax_a.set(xlabel="epoch", ylabel="accuracy (%)", title="Accuracy")
    ax_h.set(xlabel="epoch", ylabel="mean output entropy H(p) (nats)", title="Entropy")
    for ax in (ax_a, ax_h):
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(records.run_name(results), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
