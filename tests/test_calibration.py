"""Calibration (aepg_jax/metrics.py) on hand-made predictions, values worked out by hand."""

import math

import numpy as np
import pytest

from aepg_jax import metrics


def test_ece_of_examples_in_separate_bins_is_their_mean_gap():
    # 15 bins ((m-1)/15, m/15]: 0.9 -> bin 14 (13.5 -> 14), 0.95 -> bin 15, 0.6 -> bin 9
    # (0.6 = 9/15 is the bin's upper edge), 0.3 -> bin 5; one example each.
    conf = np.array([0.9, 0.95, 0.6, 0.3])
    correct = np.array([1, 0, 1, 0])
    np.testing.assert_array_equal(metrics.bin_index(conf), [13, 14, 8, 4])
    # (|1 - .9| + |0 - .95| + |1 - .6| + |0 - .3|) / 4 = 1.75 / 4
    assert metrics.ece(conf, correct) == pytest.approx(0.4375, abs=1e-12)


def test_ece_weighs_each_bin_by_its_share_of_examples():
    # 0.61 and 0.65 share bin 10 (acc 1/2, conf 0.63); 0.99 alone in bin 15, correct.
    conf = np.array([0.61, 0.65, 0.99])
    correct = np.array([True, False, True])
    # 2/3 * |0.5 - 0.63| + 1/3 * |1 - 0.99|
    assert metrics.ece(conf, correct) == pytest.approx(2 / 3 * 0.13 + 1 / 3 * 0.01, abs=1e-12)
    acc, mean_conf, count = metrics.reliability(conf, correct)
    assert count.tolist() == [0] * 9 + [2] + [0] * 4 + [1]
    assert acc[9] == 0.5 and mean_conf[9] == pytest.approx(0.63) and np.isnan(acc[0])
    assert math.isnan(metrics.ece(np.zeros(0), np.zeros(0)))


def test_nll_and_entropy():
    # -(ln 0.5 + ln 0.25) / 2 = 1.5 ln 2; a zero probability is floored at float32's tiny.
    assert metrics.nll(np.array([0.5, 0.25])) == pytest.approx(1.5 * math.log(2))
    assert metrics.nll(np.array([0.0])) == pytest.approx(-math.log(np.finfo(np.float32).tiny))
    out = metrics.calibration(
        np.array([1.0, 0.5]), np.array([1, 1]), np.array([1.0, 0.5]), np.array([0.0, math.log(2)])
    )
    # bins 15 (acc 1, conf 1) and 8 (acc 1, conf 0.5): ECE = 1/2 * 0.5
    assert out == pytest.approx({"ece": 0.25, "nll": math.log(2) / 2, "entropy": math.log(2) / 2})
