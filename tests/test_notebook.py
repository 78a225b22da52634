"""notebooks/first_look.ipynb: committed without outputs, plain Python in its code cells (no
IPython magics, so that it runs in any kernel); slow: executed top to bottom, as a kernel would,
by a small runner (`RUNNER`: each code cell compiled and executed in order in one namespace, in
a fresh Python process, matplotlib without a display), on the embedded default's run."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "first_look.ipynb"

# Executes a notebook's code cells in order; a failing cell is named as `<cell N>` in the
# traceback. Prints the number of figures drawn at the end.
RUNNER = """
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
cells = json.load(open(sys.argv[1]))["cells"]
namespace = {"__name__": "__main__"}
for n, cell in enumerate(cells):
    if cell["cell_type"] == "code":
        exec(compile("".join(cell["source"]), f"<cell {n}>", "exec"), namespace)
print(f"figures: {len(plt.get_fignums())}")
"""


def _code_cells() -> list[str]:
    notebook = json.loads(NOTEBOOK.read_text())
    assert notebook["nbformat"] == 4
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]


def test_the_notebook_is_committed_without_outputs_and_magics():
    notebook = json.loads(NOTEBOOK.read_text())
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert len(code) >= 6
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    for source in _code_cells():
        for line in source.splitlines():
            assert not line.lstrip().startswith(("!", "%")), line
        compile(source, "<cell>", "exec")


@pytest.mark.slow
def test_the_notebook_runs_the_default_and_shows_its_results(tmp_path):
    """The embedded default, then the notebook's reading of it: 4.3 min on the 2-core CPU
    shared with other jobs (load ~20; the default alone takes 37 s on the idle machine)."""
    env = {**os.environ, "AEPG_NOTEBOOK_WORKDIR": str(tmp_path / "default")}
    # this checkout's package, whichever one the venv's editable install names
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(NOTEBOOK)],
        cwd=NOTEBOOK.parent,  # where Jupyter starts a notebook's kernel
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    assert "A_T = " in out and "equal to results.json" in out
    assert "reliability" not in done.stderr
    # the matrix, the three curves, A_t, per-class accuracy and the reliability diagram
    assert "figures: 5" in out, out[-2000:]
    assert (tmp_path / "default" / "predictions.npz").exists()
