"""A run's identity (`runs/identity.py`) is what determines its results: the content of its weights
file and of a folder dataset (their locations may move), every field that acts, and a field a
saved config lacks at its schema default; `aepg_jax.main`, the sweep and the tables share it.

The saved configs under tests/fixtures/saved_configs/ are config.json of the default run
(configs/default.py) as `aepg_jax.main` wrote it at each distinct state of the schema's history
(named <date>-<commit>; tests/fixtures/make_saved_configs.py writes them)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import time

import numpy as np
import pytest
import sweep_fake
from tiny import tiny_config

from aepg_jax import main
from aepg_jax.config import command_line, schema
from aepg_jax.runs import identity
from aepg_jax.sweep import sweep
from aepg_jax.system import memory
from aepg_jax.tables import tables

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCHEMAS = main.SCHEMAS  # the trainers' schemas, as `aepg_jax.main` hands them to the identity
SAVED = sorted((ROOT / "tests" / "fixtures" / "saved_configs").glob("*.json"))
WEIGHTS = ROOT / "tests" / "fixtures" / "timm_tiny_vit.npz"  # an augreg-layout file
# The model of WEIGHTS (tests/fixtures/timm_tiny_vit_io.npz).
WEIGHTS_MODEL = {
    "model.patch_size": 8, "model.hidden_size": 32, "model.depth": 2, "model.num_heads": 2,
    "model.mlp_dim": 128, "model.image_size": 32, "data.store_size": 32,
}  # fmt: skip


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(identity.DIGEST_CACHE_ENV, str(tmp_path / "digests.json"))
    identity._MEMORY.clear()


def _default() -> dict:
    return json.loads(schema.from_file(str(ROOT / "configs" / "default.py")).to_json_best_effort())


def _weights_pair(tmp_path) -> tuple[pathlib.Path, pathlib.Path]:
    """Two weights files of one model: WEIGHTS and a copy with one array perturbed."""
    a, b = tmp_path / "a" / "weights.npz", tmp_path / "b" / "weights.npz"
    a.parent.mkdir()
    b.parent.mkdir()
    shutil.copy(WEIGHTS, a)
    with np.load(WEIGHTS) as f:
        arrays = {k: f[k] for k in f.files}
    key = sorted(arrays)[0]
    arrays[key] = arrays[key] + np.float32(1e-3)
    np.savez(b, **arrays)
    return a, b


def _checkpointed(workdir: pathlib.Path) -> None:
    (workdir / "checkpoints" / "8").mkdir(parents=True, exist_ok=True)


# --- item: fields that leave the identity --------------------------------------------------


def test_only_the_running_methods_fields_and_pretrain_when_pretraining_count():
    base = json.loads(schema.base_config("vit_tiny").to_json_best_effort())  # plain, random
    other = json.loads(json.dumps(base))
    other["method"]["ema_decay"] = 0.5  # LAE's
    other["method"]["l2p_pool_size"] = 7  # L2P's
    other["pretrain"]["epochs"] = 9  # nothing is pretrained
    assert identity.differences(base, other, SCHEMAS) == []
    for config in (base, other):
        config["method"]["name"] = "lae"
        config["model"]["init"] = "pretrained"
    assert identity.differences(base, other, SCHEMAS) == ["method.ema_decay", "pretrain.epochs"]
    assert "eval.batch_size" in identity.differences(
        base, {**base, "eval": {"batch_size": 64}}, SCHEMAS
    )  # measured: the entropy's float sums change with the eval batch


def test_a_missing_field_compares_at_its_own_trainers_schema_handed_in():
    """A saved from-scratch config without `optim.milestones` (a field the continual schema
    lacks) compares at the from-scratch schema's default; the identity knows only the schemas
    its caller hands it."""
    from aepg_jax.scratch import config as scratch_config

    today = json.loads(scratch_config.base_config("resnet_small").to_json_best_effort())
    older = json.loads(json.dumps(today))
    del older["optim"]["milestones"]
    assert identity.differences(older, today, SCHEMAS) == []
    today["optim"]["milestones"] = [10, 20]
    assert identity.differences(older, today, SCHEMAS) == ["optim.milestones"]
    # Handed no from-scratch schema, a missing field has no default to compare at.
    del today["optim"]["milestones"]
    older["optim"]["milestones"] = [150, 225]
    assert identity.differences(older, today, SCHEMAS) == []
    continual_only = {"continual": SCHEMAS["continual"]}
    assert identity.differences(older, today, continual_only) == ["optim.milestones"]


@pytest.mark.slow  # two tiny runs (~20 s each on the 2-core CPU)
def test_the_fields_left_out_leave_results_json_unchanged(tmp_path):
    """Another method's fields and pretrain.* with a random backbone: one pair of runs."""
    from aepg_jax.continual import trainer

    base = {"data.num_tasks": 2, "max_steps_per_task": 3, "method.name": "plain"}
    changed = {
        "method.ema_decay": 0.5, "method.lwf_temperature": 3.0, "method.l2p_pool_size": 7,
        "method.dualprompt_pool_size": 4, "method.coda_length": 4, "method.inflora_rank": 3,
        "pretrain.epochs": 5, "pretrain.seed": 3, "pretrain.batch_size": 64,
        "pretrain.learning_rate": 0.1, "pretrain.shipped": False,
    }  # fmt: skip
    results = []
    for name, overrides in (("a", base), ("b", {**base, **changed})):
        cfg = tiny_config(tmp_path / "cache", **overrides)
        trainer.run(cfg, str(tmp_path / name))
        results.append(json.loads((tmp_path / name / "results.json").read_text()))
    a, b = (identity.with_inputs(r.pop("config")) for r in results)
    assert identity.differences(a, b, SCHEMAS) == []
    for r in results:  # what a run's time and machine decide
        for key in ("wall_time_s", "compilations", "environment"):
            r.pop(key)
    assert results[0] == results[1]


# --- item: the weights file's and a folder dataset's content ------------------------------


def _augreg(path, **more):
    return tiny_config(
        pathlib.Path("/nonexistent"),
        **WEIGHTS_MODEL,
        **{"model.init": "augreg", "model.checkpoint": str(path), **more},
    )


def test_a_weights_file_is_its_content_not_its_path(tmp_path):
    a, b = _weights_pair(tmp_path)
    run = tmp_path / "run"
    main.check_or_save_config(_augreg(a), str(run))
    saved = json.loads((run / "config.json").read_text())
    digest = identity.file_digest(str(a))
    assert saved["inputs"] == {"model.checkpoint": f"sha256:{digest}"}
    _checkpointed(run)
    moved = tmp_path / "moved.npz"
    shutil.copy(a, moved)
    main.check_or_save_config(_augreg(moved), str(run))  # same content elsewhere: resumes
    with pytest.raises(ValueError, match=r"differs in: model.checkpoint content \(sha256 "):
        main.check_or_save_config(_augreg(b), str(run))
    # The same path, its file replaced by other weights: refused too.
    shutil.copy(b, moved)
    os.utime(moved, ns=(1, 1))  # another mtime: the digest cache does not answer for it
    with pytest.raises(ValueError, match=r"model.checkpoint content"):
        main.check_or_save_config(_augreg(moved), str(run))


def test_digests_are_cached_by_path_size_and_mtime(tmp_path, monkeypatch):
    from aepg_jax.checkpoints import weights

    monkeypatch.setattr(identity, "SETTLED_NS", 0)  # the file was written just now
    a, _ = _weights_pair(tmp_path)
    first = identity.file_digest(str(a))
    assert first == weights.file_sha256(str(a))  # results.json's backbone_source.sha256
    identity._MEMORY.clear()  # a new process: the cache file answers
    monkeypatch.setattr(weights, "file_sha256", lambda path: pytest.fail("hashed again"))
    assert identity.file_digest(str(a)) == first


def test_a_same_size_file_copied_with_its_mtime_is_hashed_again(tmp_path, monkeypatch):
    """`cp -p other weights` keeps the size and sets the old mtime: the inode's ctime still
    changes, and the digest with it (from memory and from the cache file)."""
    monkeypatch.setattr(identity, "SETTLED_NS", 0)
    a, other = tmp_path / "weights.bin", tmp_path / "other.bin"
    a.write_bytes(b"a" * 4096)
    other.write_bytes(b"b" * 4096)
    stamp = a.stat().st_mtime_ns
    os.utime(other, ns=(stamp, stamp))
    first = identity.file_digest(str(a))
    assert first == hashlib.sha256(b"a" * 4096).hexdigest()
    time.sleep(0.05)  # past the file system's timestamp tick
    shutil.copy2(other, a)  # what `cp -p` does: rewritten in place, mtime copied
    assert (a.stat().st_size, a.stat().st_mtime_ns) == (4096, stamp)
    replaced = hashlib.sha256(b"b" * 4096).hexdigest()
    assert identity.file_digest(str(a)) == replaced
    identity._MEMORY.clear()  # a new process: the cache file answers
    assert identity.file_digest(str(a)) == replaced
    assert len(json.loads((tmp_path / "digests.json").read_text())) == 1  # the old key left


def test_a_file_changed_moments_ago_is_hashed_at_every_call(tmp_path, monkeypatch):
    """Within `SETTLED_NS` of a change the file may change again under the same key."""
    from aepg_jax.checkpoints import weights

    a = tmp_path / "weights.bin"
    a.write_bytes(b"a" * 4096)
    hashed = []
    sha256 = weights.file_sha256
    monkeypatch.setattr(weights, "file_sha256", lambda path: hashed.append(path) or sha256(path))
    assert identity.file_digest(str(a)) == identity.file_digest(str(a))
    assert len(hashed) == 2
    assert not (tmp_path / "digests.json").exists()


def test_a_config_saved_before_digests_resumes_and_records_its_digest(tmp_path):
    a, _ = _weights_pair(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    old = json.loads(_augreg(a).to_json_best_effort())  # no "inputs": an earlier version's
    (run / "config.json").write_text(json.dumps(old))
    _checkpointed(run)
    main.check_or_save_config(_augreg(a), str(run))  # accepted (the fingerprint is checked)
    assert "model.checkpoint" in json.loads((run / "config.json").read_text())["inputs"]


def test_a_folder_dataset_without_a_name_is_its_listing(tmp_path):
    def folder(where, extra=b""):
        for cls in ("a", "b"):
            (where / cls).mkdir(parents=True)
            (where / cls / "0.png").write_bytes(b"x" * 10 + extra)
        return where

    one, moved = folder(tmp_path / "one"), folder(tmp_path / "elsewhere" / "two")
    other = folder(tmp_path / "three", extra=b"more")

    def config(path, name=None):
        return {"data": {"source": "folder", "data_dir": str(path), "name": name}}

    assert identity.inputs(config(one)) == identity.inputs(config(moved))
    assert identity.differences(
        identity.with_inputs(config(one)), identity.with_inputs(config(other)), SCHEMAS
    ) == [
        f"data.data_dir content (listing {identity.folder_digest(str(one))[:12]} != listing "
        f"{identity.folder_digest(str(other))[:12]})"
    ]
    assert identity.inputs(config(one, name="mine")) == {}  # data.name names the dataset


# --- item: older runs resume ----------------------------------------------------------------


def test_there_is_a_saved_config_for_each_state_of_the_schema():
    assert len(SAVED) >= 15
    assert any("67ddf42" in p.name for p in SAVED)  # the last flat-names commit


@pytest.mark.parametrize("path", SAVED, ids=lambda p: p.stem)
def test_each_earlier_saved_default_config_resumes(path, tmp_path):
    saved = json.loads(path.read_text())
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(saved))
    _checkpointed(run)
    cfg = schema.from_file(str(ROOT / "configs" / "default.py"))
    if "trainer" not in saved or "tensorboard" not in saved:
        # Before these fields, config and checkpoints had another layout: named, not resumed.
        with pytest.raises(ValueError, match=command_line.FLAT_NAMES_COMMIT):
            main.check_or_save_config(cfg, str(run))
        return
    assert identity.differences(saved, _default(), SCHEMAS) == []
    main.check_or_save_config(cfg, str(run))  # resumes: no other identity
    # A value that really changed is refused, naming the field.
    changed = json.loads(json.dumps(saved))
    changed["optim"]["learning_rate"] = 0.5
    (run / "config.json").write_text(json.dumps(changed))
    with pytest.raises(ValueError, match=r"differs in: optim.learning_rate\)"):
        main.check_or_save_config(cfg, str(run))


def test_a_field_missing_from_a_saved_config_compares_at_its_schema_default():
    today = _default()
    old = json.loads(json.dumps(today))
    del old["model"]["family"], old["data"]["scenario"]
    assert identity.differences(old, today, SCHEMAS) == []
    today["model"]["family"] = "clip"  # not the default: a field that changes results
    assert identity.differences(old, today, SCHEMAS) == ["model.family"]


def test_the_heads_init_compares_as_what_the_heads_run_also_in_configs_saved_before_it():
    """`method.head_init=official` is the method's official init. A config saved before the
    field compares as its heads ran then: CODA-P's at `method.coda_head_init` (the field it
    replaced), or N(0, 0.001^2) before that one; L2P++'s N(0, 0.001^2); LAE's as today."""
    today = _default()
    assert today["method"]["head_init"] == "official"
    today["method"]["name"] = "coda_prompt"
    older = json.loads(json.dumps(today))
    del older["method"]["head_init"]
    # normal, not uniform
    assert identity.differences(older, today, SCHEMAS) == ["method.head_init"]
    with_field = json.loads(json.dumps(older))
    for saved, same in (("uniform", ("official", "uniform")), ("normal", ("normal",))):
        with_field["method"]["coda_head_init"] = saved
        for value in ("official", "normal", "uniform", "linear"):
            today["method"]["head_init"] = value
            expected = [] if value in same else ["method.head_init"]
            assert identity.differences(with_field, today, SCHEMAS) == expected, (saved, value)
    today["method"]["head_init"] = "normal"
    assert identity.differences(older, today, SCHEMAS) == []
    for name, earlier in (("l2p", "normal"), ("lae", "official"), ("sd_lora", "linear")):
        today["method"]["name"] = older["method"]["name"] = name
        today["method"]["head_init"] = earlier
        assert identity.differences(older, today, SCHEMAS) == [], name
        today["method"]["head_init"] = "trunc_normal"
        assert identity.differences(older, today, SCHEMAS) == ["method.head_init"], name


def test_a_run_saved_before_head_init_resumes_with_the_init_its_heads_ran(tmp_path):
    """A CODA-P run saved with `method.coda_head_init` (the field `method.head_init` replaced)
    and an L2P++ run saved before either (heads N(0, 0.001^2)): `main` resumes each with the
    init its heads ran, and refuses another, naming `method.head_init`."""
    claims = str(ROOT / "configs" / "claims.py")
    for method, saved_field, ran in (
        ("coda_prompt", {"coda_head_init": "normal"}, "normal"),
        ("coda_prompt", {"coda_head_init": "uniform"}, "official"),
        ("l2p", {}, "normal"),
    ):
        run = tmp_path / f"{method}-{ran}"
        run.mkdir()
        saved = json.loads(schema.from_file(claims, f"method={method}").to_json_best_effort())
        del saved["method"]["head_init"]
        saved["method"].update(saved_field)
        (run / "config.json").write_text(json.dumps(saved))
        _checkpointed(run)
        main.check_or_save_config(
            schema.from_file(claims, f"method={method},head_init={ran}"), str(run)
        )
        other = "trunc_normal"
        with pytest.raises(ValueError, match=r"differs in: method\.head_init\)"):
            main.check_or_save_config(
                schema.from_file(claims, f"method={method},head_init={other}"), str(run)
            )


# --- the sweep and the tables ----------------------------------------------------------------


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake experiment; main.execute replaced by one that saves config.json as main does
    and results.json as a run does (A_T = 10 x the first weight byte's parity + seed)."""
    monkeypatch.setattr(memory, "apply_default", lambda: False)
    calls = []

    def execute(cfg, workdir):
        main.check_or_save_config(cfg, workdir)
        config = json.loads(cfg.to_json_best_effort())
        calls.append(os.path.relpath(workdir, tmp_path / "runs"))
        a_t = 10.0 * (1 + ("/b/" in str(cfg.model.checkpoint))) + cfg.seed
        results = {"A_T": a_t, "avg_inc_acc": 1.0, "config": config}
        pathlib.Path(workdir, "results.json").write_text(json.dumps(results))
        return results

    monkeypatch.setattr(main, "execute", execute)
    return sweep_fake.write(tmp_path), tmp_path / "runs", calls


def test_a_sweep_with_other_weights_on_one_directory_refuses_then_reruns(fake, tmp_path, capsys):
    path, root, calls = fake
    a, b = _weights_pair(tmp_path)
    model = [f"--config.{k}={v}" for k, v in WEIGHTS_MODEL.items()] + ["--config.model.init=augreg"]
    argv = [f"--experiment={path}", f"--workdir={root}", "--compile_cache=", "--where=loss=ce"]
    assert sweep.main([*argv, *model, f"--config.model.checkpoint={a}"]) == 0
    assert len(calls) == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as err:
        sweep.main([*argv, *model, f"--config.model.checkpoint={b}"])
    line = capsys.readouterr().err.strip()
    assert err.value.code == 2 and len(calls) == 2
    assert "differs in: model.checkpoint content (sha256 " in line and "(and 1 more runs)" in line
    # The tables with B's weights never show A's numbers.
    b_flag = f"--config.model.checkpoint={b}"
    assert tables.main([str(root), "--no_plots", *model, b_flag]) == 1
    assert "| CE | — (0/2 done, 2 of another config) |" in capsys.readouterr().out
    # --rerun_changed trains B's runs; the tables (the sweep's recorded overrides) show them.
    assert sweep.main([*argv, *model, b_flag, "--rerun_changed"]) == 0
    assert len(calls) == 4
    capsys.readouterr()
    assert tables.main([str(root), "--no_plots", "--where=loss=ce"]) == 0
    out, err_text = capsys.readouterr()
    assert "| CE | 20.5 ± 0.7 (n=2) |" in out, out + err_text
    assert "note:" in err_text  # two override sets (A's and B's weights) were swept here


def test_tables_show_the_runs_of_the_sweeps_overrides_and_name_a_damaged_one(fake, capsys):
    path, root, calls = fake
    argv = [f"--experiment={path}", f"--workdir={root}", "--compile_cache="]
    assert sweep.main([*argv, "--where=loss=ce", "--config.optim.epochs=3"]) == 0
    assert calls == [
        "fake_config/loss=ce,seed=0+optim.epochs=3",
        "fake_config/loss=ce,seed=1+optim.epochs=3",
    ]
    capsys.readouterr()
    assert tables.main([str(root), "--no_plots", "--where=loss=ce"]) == 0
    out, err_text = capsys.readouterr()
    assert "| CE | 10.5 ± 0.7 (n=2) |" in out and "1 row (aEPG): no run selected" in out
    assert err_text == "note: these tables show the runs of --config.optim.epochs=3.\n"
    # The experiment's own runs: none ran.
    assert tables.main([str(root), "--no_plots", "--where=loss=ce", "--no_overrides"]) == 1
    assert "| CE | — (0/2 done) |" in capsys.readouterr().out
    # A finished-looking run folder without results.json is named and counted as failed.
    run = root / "fake_config/loss=ce,seed=1+optim.epochs=3"
    (run / "results.json").unlink()
    (run / "metrics.jsonl").write_text(json.dumps({"type": "eval", "task": 1}) + "\n")
    assert tables.main([str(root), "--no_plots", "--where=loss=ce"]) == 0  # one was read
    out, err_text = capsys.readouterr()
    assert "| CE | 10.0 (1/2 done, 1 failed) |" in out
    assert (
        f"warning: {run} has its last task's evaluation in metrics.jsonl but no results.json"
        in (err_text)
    )
