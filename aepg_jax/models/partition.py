"""Parameter partitions: `backbone` (frozen), `peft`, `head`, by ordered regex rules.

Every parameter's `/`-joined name (e.g. `Transformer/encoderblock_0/LayerNorm_0/scale`) is
labelled by the first rule whose regex `re.search`es it; an unmatched name is an error that
names it. The optimizer is `optax.partition` (formerly `multi_transform`) over those labels:
trainable labels get the configured transformation, the others `optax.set_to_zero()` and so
carry no optimizer state. The `peft` label can be gated per step by a traced flag
(`opt.update(..., train_peft=False)`, docs/algorithm.md §6's head-only epochs): its updates are
zero and its Adam state untouched, with no new optimizer and no recompilation.

The train step differentiates only the trainable subtree:

    trainable, frozen = split(params, labels, TRAINABLE)
    loss, grads = jax.value_and_grad(lambda t: loss_fn(merge(t, frozen)))(trainable)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

Params = dict[str, Any]
Rules = Sequence[tuple[str, str]]

BACKBONE, PEFT, HEAD = "backbone", "peft", "head"
# A trainable copy of the whole backbone (full fine-tuning, SLCA's slow learner) under the
# top-level key `finetuned/`; the frozen backbone beside it is then unused.
FINETUNED = "finetuned"
TRAINABLE = (PEFT, HEAD, FINETUNED)

DEFAULT_RULES: Rules = (
    (r"(^|/)(lora|adapter|prefix)/", PEFT),
    (r"^prompt/", PEFT),  # the prompt baselines' prompts, keys and attention vectors
    (r"^head/", HEAD),
    (r"^cosine_scale$", PEFT),  # the cosine head's scale (`head.COSINE_SCALE`)
    (r"^finetuned/", FINETUNED),
    (r"^(embedding|cls|Transformer)(/|$)", BACKBONE),
)


def _flat(params: Params) -> dict[tuple[str, ...], Any]:
    return traverse_util.flatten_dict(params)


def named_leaves(params: Params) -> dict[str, Any]:
    """`{"/"-joined name: leaf}` for every leaf."""
    return {"/".join(path): leaf for path, leaf in _flat(params).items()}


def param_names(params: Params) -> list[str]:
    """The `/`-joined names of every leaf, in flattening order."""
    return ["/".join(path) for path in _flat(params)]


def label_params(params: Params, rules: Rules = DEFAULT_RULES) -> Params:
    """A tree like `params` holding each leaf's label (first matching rule wins)."""
    compiled = [(re.compile(pattern), label) for pattern, label in rules]
    labels, unmatched = {}, []
    for path in _flat(params):
        name = "/".join(path)
        label = next((lab for rx, lab in compiled if rx.search(name)), None)
        if label is None:
            unmatched.append(name)
        labels[path] = label
    if unmatched:
        shown = ", ".join(unmatched[:10]) + (" ..." if len(unmatched) > 10 else "")
        raise ValueError(
            f"{len(unmatched)} parameter(s) match no partition rule: {shown}. "
            f"Rules (regex -> label): {list(rules)}. Add a rule that covers them."
        )
    return traverse_util.unflatten_dict(labels)


def split(params: Params, labels: Params, keep: Collection[str]) -> tuple[Params, Params]:
    """`(kept, rest)`: the leaves whose label is in `keep`, and all the others, as nested dicts."""
    flat, flat_labels = _flat(params), _flat(labels)
    if flat.keys() != flat_labels.keys():
        raise ValueError("labels do not have the structure of params; relabel after changing them.")
    kept = {k: v for k, v in flat.items() if flat_labels[k] in keep}
    rest = {k: v for k, v in flat.items() if flat_labels[k] not in keep}
    return traverse_util.unflatten_dict(kept), traverse_util.unflatten_dict(rest)


def merge(*trees: Params) -> Params:
    """Union of disjoint nested dicts (inverse of `split`); a leaf in two trees is an error."""
    merged: dict[tuple[str, ...], Any] = {}
    for tree in trees:
        for path, leaf in _flat(tree).items():
            if path in merged:
                raise ValueError(f"Parameter {'/'.join(path)} appears in more than one tree.")
            merged[path] = leaf
    return traverse_util.unflatten_dict(merged)


def count(params: Params, labels: Params | None = None) -> dict[str, int]:
    """Number of scalars per label (all under `total`; only `total` without labels)."""
    flat = _flat(params)
    sizes = {"total": sum(int(x.size) for x in flat.values())}
    if labels is not None:
        for path, label in _flat(labels).items():
            sizes[label] = sizes.get(label, 0) + int(flat[path].size)
    return sizes


def _gated(tx: optax.GradientTransformation, label: str) -> optax.GradientTransformation:
    """`tx` applied only while the update's extra arg `train_<label>` is True (default True)."""
    flag = f"train_{label}"

    def should_transform(step, **extra):
        del step
        return jnp.asarray(extra.get(flag, True), bool)

    return optax.conditionally_mask(tx, should_transform, forward_extra_args=True)


def make_optimizer(
    labels: Params,
    tx: optax.GradientTransformation,
    trainable: Collection[str] = TRAINABLE,
    gated: Collection[str] = (PEFT,),
    lr_scales: dict[str, float] | None = None,
) -> optax.GradientTransformationExtraArgs:
    """`optax.partition` over `labels`: `tx` for trainable labels, `set_to_zero` for the rest.

    Each trainable label gets its own state of `tx` (e.g. its own Adam moments and count).
    Labels in `gated` train only while `update(..., train_<label>=True)` (the default).
    `lr_scales[label] = s` multiplies that label's updates by s: its learning rate is s times
    the configured one (a torch parameter group's own `lr`, schedule and momentum shared).
    """
    present = set(jax.tree.leaves(labels))
    scales = lr_scales or {}
    transforms = {}
    for label in sorted(present):
        if label not in trainable:
            transforms[label] = optax.set_to_zero()
            continue
        label_tx = (
            tx if scales.get(label, 1.0) == 1.0 else optax.chain(tx, optax.scale(scales[label]))
        )
        transforms[label] = _gated(label_tx, label) if label in gated else label_tx
    return optax.partition(transforms, labels)


def value_and_grad_trainable(
    loss_fn: Callable[..., Any], has_aux: bool = False
) -> Callable[..., Any]:
    """`(trainable, frozen, *args) -> (loss, grads)` with grads for `trainable` only.

    `loss_fn(params, *args)` sees `merge(trainable, frozen)`; `frozen` is not differentiated,
    so no gradient of a frozen leaf is ever built.
    """

    def wrapped(trainable: Params, frozen: Params, *args: Any):
        return jax.value_and_grad(lambda t: loss_fn(merge(t, frozen), *args), has_aux=has_aux)(
            trainable
        )

    return wrapped
