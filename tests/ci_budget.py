"""Tests that CI leaves out although their files do not mark them `slow` (`tests/conftest.py`
marks them): each one's cost is what it checks, several whole runs or a first run's compiling,
which a smaller model or the session's compilation cache would not check. They run with the
other slow tests (`-m slow`); an id here whose test function is not in its file stops the
collection. The figure: seconds in the fast suite on two workers (2026-11-28).
"""

# ruff: noqa: E501 (test ids are as long as their names)

SLOW_IN_CI = {
    "tests/test_preemption.py::test_a_stop_signal_checkpoints_the_step_and_the_rerun_resumes_exactly[15]": (
        113,
        "four runs of 300 steps: one straight, one stopped mid-task by the signal and resumed "
        "through `aepg_jax.main`, one stopped at a task's last step and resumed",
    ),
    "tests/test_multiseed.py::test_seed_i_of_a_vmapped_run_equals_a_single_run_of_seed_i[pretrained-lae-per-step]": (
        90,
        "a vmapped run of the seeds and a single run of each, compared step by step",
    ),
    "tests/test_compiles.py::test_default_config_compiles_as_often_with_5_tasks_as_with_2": (
        49,
        "two runs of the default config, each compiling every program from an empty cache",
    ),
    "tests/test_scratch.py::test_8_devices_match_one_device": (
        40,
        "a run on one device and the same run compiled for 8 devices in a second process",
    ),
    "tests/test_preemption.py::test_the_scratch_trainer_stops_inside_an_epoch_and_resumes_exactly": (
        39,
        "four scratch runs: one straight, one stopped, its rerun stopped again, the last rerun",
    ),
}
