"""Calibration of test predictions (docs/algorithm.md §4), pure NumPy on kept predictions.

For n test examples with confidence `c_i = max_k p_i(k)` (the top probability), correctness
`z_i = [argmax_k p_i(k) = y_i]`, probability of the true class `p_i(y_i)` and entropy
`H_i = -sum_k p_i(k) log p_i(k)`:

    * `ece = sum_m |B_m| / n * |acc(B_m) - conf(B_m)|`   expected calibration error over
      M = 15 equal-width confidence bins `B_m = {i: c_i in ((m-1)/M, m/M]}`, `acc(B_m)` the
      bin's mean `z_i`, `conf(B_m)` its mean `c_i` (Guo et al. 2017, "On Calibration of
      Modern Neural Networks", Eq. 3); empty bins add nothing
    * `nll = -mean_i log max(p_i(y_i), FLOOR)`        negative log-likelihood in nats; FLOOR,
      float32's smallest normal number, caps an example whose true class has probability 0
      (underflow) at 87.3 nats
    * `entropy = mean_i H_i`                          mean entropy of the predictions in nats

Each is over every seen test example after a task (the classes of later tasks have probability
0: `methods/base.py` `mask_unseen`).
"""

from __future__ import annotations

import numpy as np

BINS = 15
FLOOR = float(np.finfo(np.float32).tiny)


def bin_index(confidence: np.ndarray, bins: int = BINS) -> np.ndarray:
    """The bin `m - 1` (0-based) of each confidence: `ceil(c M) - 1`, bin 0 holding [0, 1/M]."""
    c = np.asarray(confidence, np.float64)
    return np.clip(np.ceil(c * bins).astype(np.int64) - 1, 0, bins - 1)


def reliability(
    confidence: np.ndarray, correct: np.ndarray, bins: int = BINS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per bin `(accuracy, mean confidence, count)`, each (bins,); NaN for an empty bin."""
    c = np.asarray(confidence, np.float64)
    z = np.asarray(correct, np.float64)
    if c.shape != z.shape or c.ndim != 1:
        raise ValueError(
            f"confidence and correct must be equal 1-d shapes; got {c.shape}, {z.shape}."
        )
    m = bin_index(c, bins)
    count = np.bincount(m, minlength=bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.bincount(m, weights=z, minlength=bins) / count
        conf = np.bincount(m, weights=c, minlength=bins) / count
    return acc, conf, count.astype(np.int64)


def ece(confidence: np.ndarray, correct: np.ndarray, bins: int = BINS) -> float:
    """Expected calibration error (fraction in [0, 1]); NaN with no example."""
    acc, conf, count = reliability(confidence, correct, bins)
    n = count.sum()
    if n == 0:
        return float("nan")
    seen = count > 0
    return float(np.sum(count[seen] / n * np.abs(acc[seen] - conf[seen])))


def nll(p_true: np.ndarray) -> float:
    """`-mean log max(p(y), FLOOR)` in nats; NaN with no example."""
    p = np.asarray(p_true, np.float64)
    if p.size == 0:
        return float("nan")
    return float(-np.mean(np.log(np.maximum(p, FLOOR))))


def of_examples(
    confidence: np.ndarray, correct: np.ndarray, p_true: np.ndarray, entropy: np.ndarray
) -> dict[str, float]:
    """`{"ece", "nll", "entropy"}` of one evaluation's examples (ECE as a fraction)."""
    h = np.asarray(entropy, np.float64)
    return {
        "ece": ece(confidence, correct),
        "nll": nll(p_true),
        "entropy": float(h.mean()) if h.size else float("nan"),
    }
