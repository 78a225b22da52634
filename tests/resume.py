"""A run killed in a method's end-of-task pass resumes to the uninterrupted run's results."""

import pytest

from aepg_jax.continual import trainer


def assert_resumes_after_a_crash_in_end_task(cls, cfg, workdir, straight, monkeypatch, task=1):
    """`cls.end_task` raises at task `task` (a process killed in the task's statistics pass):
    the run fails, then the same command restarts from the checkpoint before it and ends with
    the accuracy matrix and entropy of `straight`, the uninterrupted run's results (a method
    whose logits are scores logs no entropy: both null, with the same note)."""
    end_task = cls.end_task

    def crash(self, spec, trainable, state, ctx):
        if spec.index == task:
            raise RuntimeError("killed at the end of the task")
        return end_task(self, spec, trainable, state, ctx)

    monkeypatch.setattr(cls, "end_task", crash)
    with pytest.raises(RuntimeError, match="killed"):
        trainer.run(cfg, str(workdir))
    monkeypatch.undo()
    resumed = trainer.run(cfg, str(workdir))
    assert resumed["accuracy_matrix"] == straight["accuracy_matrix"]
    if straight.get("entropy_note"):
        assert resumed["entropy"] == straight["entropy"] == [None] * len(straight["entropy"])
        assert resumed["entropy_note"] == straight["entropy_note"]
        assert resumed.get("calibration_note") == straight.get("calibration_note")
    else:
        assert resumed["entropy"] == pytest.approx(straight["entropy"], rel=1e-6)
