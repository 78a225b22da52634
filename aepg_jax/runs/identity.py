"""A run's identity: what determines its results.

A run's identity is its config (JSON) with three adjustments, and nothing else decides whether
two configs are the same run: `aepg_jax.main` refuses to resume a run of another identity,
`aepg_jax.sweep` (its conflicts and `--rerun_changed`) and `aepg_jax.tables` compare saved and
expected configs with `differences`.

1. Locations leave it (`NOT_IDENTITY`): where inputs and caches are, how often to log and
   checkpoint, how processes start. A field that names a file whose content decides results
   (`model.checkpoint`, and `data.data_dir` of a folder dataset without `data.name`) enters by
   its content instead: `inputs(config)` is `{field: digest}`, saved beside the config in
   config.json as `"inputs"`. So a moved weights file or data folder with the same content
   resumes its run; another file under the same path is another run.
2. Fields that act in no way in this config leave it (`inactive`): another method's
   `method.*` fields, and `pretrain.*` when nothing is pretrained (`model.init` is not
   `pretrained`). tests/test_identity.py shows results.json unchanged when they change.
3. A field missing from a saved config (written before the field existed) compares equal at
   its current default, taken from its trainer's schema (`Schemas`: each caller hands the
   trainers' schemas in, `aepg_jax.main.SCHEMAS`, so that storage knows no trainer): a run
   written by an earlier version resumes. A field whose default is not what earlier versions
   did compares at that earlier value (`EARLIER_VALUES`). The heads' init
   compares as what the heads run (`with_head_init`): `method.head_init=official` as the
   method's official init, and a config saved before that field as what its heads ran then
   (`Method.earlier_head_init`: CODA-P's `method.coda_head_init`, the field it replaced, or
   N(0, 0.001^2) for the methods whose heads started so): such an L2P++ run differs in
   `method.head_init` and resumes with `--config.method.head_init=normal`.
   An input digest missing from a saved config (written before digests were saved) is not
   compared there: the checkpoint's backbone fingerprint is still checked on resume
   (`continual/trainer.py`), and a finished run's results.json records its weights' sha256
   (`backbone_source.sha256`), which `saved_inputs` reads.

`eval.batch_size` and `optim.steps_per_call` stay in: results.json measurably changes with them
(the entropy's float sums with the eval batch; the scanned steps' float order).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import time
from collections.abc import Callable, Mapping
from typing import Any

# Config fields that do not change a run's result: where its inputs and caches are, how often it
# logs and checkpoints, how its processes start. The content of the files named by
# `model.checkpoint` and a folder dataset's `data.data_dir` enters through `inputs`.
NOT_IDENTITY = frozenset({
    "data.data_dir", "data.cache_dir", "data.verify_cache", "model.checkpoint",
    "pretrain.data_dir", "pretrain.cache_dir", "log_every_steps", "checkpoint_every_steps",
    "checkpoint_every_minutes", "checkpoint_every_epochs", "tensorboard", "distributed",
    "compile_cache",
})  # fmt: skip

# Fields added with a default that is not what configs written before them ran with: a saved
# config without the field compares at this value instead of the schema's default.
EARLIER_VALUES: dict[str, Any] = {}
HEAD_INIT = "method.head_init"
REPLACED_BY_HEAD_INIT = ("method.coda_head_init",)  # fields `method.head_init` replaced

# config.trainer -> its schema's `base_config(preset)` (a ConfigDict of every field's default).
Schemas = Mapping[str, Callable[..., Any]]
INPUTS_KEY = "inputs"  # config.json's {field: digest} of the files the config names
DIGEST_CACHE_ENV = "AEPG_DIGEST_CACHE"  # the file digests' cache (default ~/.cache/aepg_jax)
_MISSING = object()


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out |= flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


@functools.cache
def _defaults(base_config: Callable[..., Any], preset: str | None) -> dict[str, Any]:
    """The flat JSON defaults of a schema's `base_config` (for `preset`, else its own)."""
    try:
        base = base_config(preset) if preset else base_config()
    except (KeyError, ValueError):  # a preset this version does not know
        base = base_config()
    return flatten(json.loads(base.to_json_best_effort()))


def with_head_init(flat: dict[str, Any]) -> dict[str, Any]:
    """The (flat) continual config `flat` with `method.head_init` as the init its heads run:
    `official` as its method's `official_head_init`, absent (a config saved before the field)
    as `Method.earlier_head_init`; the fields it replaced leave."""
    out = {k: v for k, v in flat.items() if k not in REPLACED_BY_HEAD_INIT}
    name = flat.get("method.name")
    if flat.get("trainer", "continual") != "continual" or not isinstance(name, str):
        return out
    from aepg_jax import methods

    method = methods.REGISTRY.get(name)
    if method is None:
        return out
    init = flat[HEAD_INIT] if HEAD_INIT in flat else method.earlier_head_init(flat)
    out[HEAD_INIT] = method.official_head_init if init == methods.OFFICIAL_HEAD_INIT else init
    return out


def defaults_of(flat: dict[str, Any], schemas: Schemas) -> dict[str, Any]:
    """The schema defaults of the (flat) config `flat`'s trainer and model preset ({} for a
    trainer `schemas` does not hold: its missing fields compare as missing)."""
    base_config = schemas.get(flat.get("trainer", "continual"))
    if base_config is None:
        return {}
    preset = flat.get("model.preset")
    return _defaults(base_config, preset if isinstance(preset, str) else None)


def inactive(flat: dict[str, Any]) -> set[str]:
    """The fields of the (flat) config `flat` that act in no way in it: the `method.*` fields
    of the methods it does not run, `pretrain.*` when its backbone is not pretrained."""
    out: set[str] = set()
    name = flat.get("method.name")
    if flat.get("trainer", "continual") == "continual" and isinstance(name, str):
        from aepg_jax import methods

        if name in methods.REGISTRY:
            own = set(methods.REGISTRY[name].defaults)
            out |= {f"method.{f}" for f in methods.defaults() if f not in own}
    if flat.get("trainer", "continual") == "continual" and flat.get("model.init") != "pretrained":
        out |= {k for k in flat if k.startswith("pretrain.")}
    return out


# --- the content of the files a config names ---------------------------------------------------


def _cache_path() -> pathlib.Path:
    where = os.environ.get(DIGEST_CACHE_ENV)
    if where:
        return pathlib.Path(where)
    return pathlib.Path(os.path.expanduser("~/.cache/aepg_jax")) / "file_digests.json"


_MEMORY: dict[str, str] = {}
# A file changed this recently may change again within its timestamps' resolution (a clock tick,
# or a second or two on some file systems) without changing its key: its digest is not kept.
SETTLED_NS = 2 * 10**9


def _digest_key(real: str, stat: os.stat_result) -> str:
    """What a changed file changes: size, mtime, and the inode and ctime, which `cp -p` (or
    any rewrite that restores the mtime) cannot keep."""
    return f"{real}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}|{stat.st_ctime_ns}"


def file_digest(path: str) -> str:
    """sha256 of the file `path` (hex), as `checkpoints.weights.file_sha256` computes it;
    cached by (real path, size, mtime, inode, ctime) in memory and in `AEPG_DIGEST_CACHE`, so
    that the runs of a sweep hash a 300 MB weights file once. A file changed less than
    `SETTLED_NS` ago, or while it was hashed, is hashed again next time."""
    real = os.path.realpath(path)
    now = time.time_ns()
    stat = os.stat(real)
    key = _digest_key(real, stat)
    if key in _MEMORY:
        return _MEMORY[key]
    cache = _cache_path()
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    found = known.get(key)
    if isinstance(found, str):
        _MEMORY[key] = found
        return found
    from aepg_jax.checkpoints import weights

    found = weights.file_sha256(real)
    settled = now - stat.st_ctime_ns >= SETTLED_NS  # ctime: set by the kernel, at every change
    if not settled or _digest_key(real, os.stat(real)) != key:
        return found
    # The file's earlier keys name content it no longer has.
    known = {k: v for k, v in known.items() if k.rsplit("|", 4)[0] != real}
    known[key] = found
    try:  # a cache that cannot be written only costs a re-hash next time
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, cache)
    except OSError:
        pass
    _MEMORY[key] = found
    return found


def folder_digest(root: str) -> str:
    """sha256 over a folder's listing: every file's path relative to `root` and its size, in
    sorted order (the folder's location leaves it; hidden files too are listed)."""
    real = os.path.realpath(os.path.expanduser(root))
    if real in _MEMORY:
        return _MEMORY[real]
    entries = []
    for directory, _, files in os.walk(real):
        for name in files:
            path = os.path.join(directory, name)
            entries.append(f"{os.path.relpath(path, real)}\0{os.path.getsize(path)}")
    digest = hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()
    _MEMORY[real] = digest
    return digest


def weights_file(flat: dict[str, Any]) -> str | None:
    """The local weights file a (flat) config loads (`model.init=augreg`: `model.checkpoint`, or
    `model.weights`' hub file), None when it loads none."""
    if flat.get("model.init") != "augreg":
        return None
    from aepg_jax.checkpoints import catalog, weights

    checkpoint = flat.get("model.checkpoint")
    name = flat.get("model.weights")
    if not checkpoint and name in catalog.WEIGHTS:
        checkpoint = catalog.WEIGHTS[name].checkpoint
    return weights.local_path(checkpoint) if checkpoint else None


def inputs(config: dict) -> dict[str, str]:
    """`{field: digest}` of the files the config (JSON) names whose content decides its results:
    `model.checkpoint` (`sha256:<hex>` of the weights file, whichever way it is named) and a
    folder dataset's `data.data_dir` without `data.name` (`listing:<hex>`, `folder_digest`).
    A file that cannot be found or read is left out (its loader names the problem)."""
    flat = flatten({k: v for k, v in config.items() if k != INPUTS_KEY})
    out = {}
    try:
        path = weights_file(flat)
        if path is not None:
            out["model.checkpoint"] = f"sha256:{file_digest(path)}"
    except Exception:  # a missing / unresolvable file: validation and the loader say why
        pass
    data_dir = flat.get("data.data_dir")
    if flat.get("data.source") == "folder" and not flat.get("data.name") and data_dir:
        if os.path.isdir(os.path.expanduser(data_dir)):
            out["data.data_dir"] = f"listing:{folder_digest(data_dir)}"
    return out


def with_inputs(config: dict) -> dict:
    """`config` (JSON) with its `inputs` (what config.json holds)."""
    found = inputs(config)
    return {**config, INPUTS_KEY: found} if found else dict(config)


def saved_inputs(config: dict | None, results: dict | None = None) -> dict[str, str]:
    """The input digests a run was made with: its config.json's, else (a config written before
    digests were saved) the weights' sha256 its results.json records."""
    found = dict((config or {}).get(INPUTS_KEY) or {})
    source = (results or {}).get("backbone_source")
    if "model.checkpoint" not in found and isinstance(source, dict) and source.get("sha256"):
        if (results.get("config") or {}).get("model", {}).get("init") == "augreg":
            found["model.checkpoint"] = f"sha256:{source['sha256']}"
    return found


def _short(digest: str | None) -> str:
    kind, _, hexa = (digest or "").partition(":")
    return f"{kind} {hexa[:12]}" if hexa else "none"


def differences(a: dict, b: dict, schemas: Schemas, *, contents: bool = True) -> list[str]:
    """The fields (dotted) in which the configs `a` and `b` (JSON dicts, each with its `inputs`
    where known) give different results, sorted: every field but `NOT_IDENTITY`'s and those
    inactive in both; a field missing from one compares at its default in its trainer's schema
    (`schemas`). With `contents`, a file whose digest both record and that differs is named as
    `<field> content (<digest a> != <digest b>)`."""
    fa = with_head_init(flatten({k: v for k, v in a.items() if k != INPUTS_KEY}))
    fb = with_head_init(flatten({k: v for k, v in b.items() if k != INPUTS_KEY}))
    da, db = defaults_of(fa, schemas), defaults_of(fb, schemas)
    skip = NOT_IDENTITY | (inactive(fa) & inactive(fb))
    out = []
    for k in fa.keys() | fb.keys():
        if k in skip:
            continue
        va = fa.get(k, EARLIER_VALUES.get(k, da.get(k, _MISSING)))
        vb = fb.get(k, EARLIER_VALUES.get(k, db.get(k, _MISSING)))
        if va != vb:
            out.append(k)
    if contents:
        ia, ib = a.get(INPUTS_KEY) or {}, b.get(INPUTS_KEY) or {}
        for k in sorted(ia.keys() & ib.keys()):
            if ia[k] != ib[k]:
                out.append(f"{k} content ({_short(ia[k])} != {_short(ib[k])})")
    return sorted(out)


def value_text(value: Any) -> str:
    """A config value as a run name shows it: text as is, anything else as compact JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
