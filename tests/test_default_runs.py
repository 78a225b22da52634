"""Every method's run of the embedded default (`python -m aepg_jax.main
--config=configs/default.py --config.method.name=M`) gives the accuracy matrices of the stored
runs, `tests/fixtures/default_runs.json` (every predictor's, exactly, as floats): a refactoring
of the methods does not move their results. LAE's run is CI's (~40 s on 2 cores); the others
run with the slow tests (30 s to 6 min each)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from aepg_jax import methods

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "default_runs.json"


CASES = [
    pytest.param(name, marks=() if name == "lae" else pytest.mark.slow, id=name)
    for name in methods.NAMES
]


@pytest.fixture(scope="module")
def stored() -> dict:
    if not FIXTURE.exists():
        pytest.skip(f"{FIXTURE.relative_to(ROOT)} is not in this checkout")
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("name", CASES)
def test_default_run_gives_the_stored_accuracy_matrices(tmp_path, stored, name):
    workdir = tmp_path / name
    command = [sys.executable, "-m", "aepg_jax.main", "--config=configs/default.py"]
    command += [f"--config.method.name={name}", f"--workdir={workdir}"]
    done = subprocess.run(command, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads((workdir / "results.json").read_text())
    want = stored[name]
    assert sorted(got["methods"]) == sorted(want["methods"])
    for predictor, scores in want["methods"].items():
        ours = got["methods"][predictor]
        assert ours["accuracy_matrix"] == scores["accuracy_matrix"], (name, predictor)
        assert ours["A_T"] == scores["A_T"], (name, predictor)
    assert got["A_T"] == want["A_T"]
