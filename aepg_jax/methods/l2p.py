"""L2P++ (docs/algorithm.md §11): L2P as CODA-Prompt's code runs it (`--prompt_param 30 20 -1`,
GT-RIPL/CODA-Prompt models/zoo.py L2P), which is what the paper's Table 1 reports.

Per prompted block l (`method.l2p_blocks`, default block 0): a pool of M = `l2p_pool_size` (30)
prompts P_l (M, L, D) with keys K_l (M, D), L = `l2p_length` (20), all ~ U(0, 1) (torch's
`uniform_`). Train and test alike, with no task identity:

    s[b, j] = cos(q_b, K_j);   idx_b = top_k(s_b, k),  k = `l2p_top_k` (5)
    prefix_b = the k selected prompts, each split into L/2 key and L/2 value tokens
               (k L/2 key and k L/2 value tokens in all: 50 + 50 by default)

Loss term (matching): w * sum_l sum_b sum_{j in idx_b} (1 - s[b, j]) / B, w = `l2p_match_weight`
(1). This is the intended per-sample form (a decision, docs/algorithm.md §11); CODA's code indexes
`cos_sim[:, k_idx]`, a (B, B, k) tensor that sums 1 - cos over every sample's pairing with
every other sample's selected keys. q carries no gradient, so the term trains the keys only.

Domain-incremental (`data.scenario=domain`, docs/algorithm.md §17): runs. The pool and its
top-k selection are shared by all tasks and need no task identity; the one head covers every
class (`prompting.py`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections

from aepg_jax.methods import prompting
from aepg_jax.methods.base import Params
from aepg_jax.methods.blocks import block_problems
from aepg_jax.models import vit


def select(q: jax.Array, keys: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
    """`(idx (B, k), s (B, M))`: the `top_k` keys most cosine-similar to each query."""
    s = prompting.cosine(q, keys)
    return jax.lax.top_k(s, top_k)[1], s


class L2P(prompting.PromptMethod):
    """L2P++: a shared prompt pool, top-k key matching, prefix prompts."""

    name = "l2p"
    # CODA-Prompt's `ViTZoo.last = nn.Linear(768, C)`, torch's default init (models/zoo.py
    # L374, built by learners/prompt.py L132); N(0, 0.001^2) before `method.head_init`.
    official_head_init = "uniform"
    head_init_before_field = "normal"
    defaults: ClassVar[dict[str, Any]] = {
        "l2p_pool_size": 30,
        "l2p_length": 20,
        "l2p_top_k": 5,
        "l2p_blocks": (0,),
        "l2p_match_weight": 1.0,
    }

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        m = cfg.method
        p = prompting.positive_int_problems(m, ("l2p_pool_size", "l2p_length", "l2p_top_k"))
        if not p and m.l2p_length % 2:
            p.append(f"method.l2p_length={m.l2p_length} must be even (L/2 keys, L/2 values).")
        if not p and m.l2p_top_k > m.l2p_pool_size:
            p.append(
                f"method.l2p_top_k={m.l2p_top_k} must be <= method.l2p_pool_size={m.l2p_pool_size}."
            )
        if not m.l2p_match_weight >= 0:
            p.append(f"method.l2p_match_weight={m.l2p_match_weight} must be >= 0.")
        if m.name == cls.name:
            p += block_problems(
                "l2p_blocks", m.l2p_blocks, cfg.model.depth, cls.defaults["l2p_blocks"]
            )
        return p

    def init_prompts(self, key: jax.Array) -> Params:
        m, n = self.cfg.method, len(self.blocks("l2p_blocks"))
        k_keys, k_prompts = jax.random.split(key)
        size, width = m.l2p_pool_size, self.width
        return {
            "keys": prompting.uniform(k_keys, (n, size, width), 0.0, 1.0),
            "prompts": prompting.uniform(k_prompts, (n, size, m.l2p_length, width), 0.0, 1.0),
        }

    def prefixes(
        self, q: jax.Array, prompts: Params, task: int, train: bool
    ) -> tuple[vit.Prefixes, jax.Array | None]:
        m, batch = self.cfg.method, q.shape[0]
        prefixes, match = {}, jnp.zeros([], jnp.float32)
        for i, block in enumerate(self.blocks("l2p_blocks")):
            idx, s = select(q, prompts["keys"][i], m.l2p_top_k)
            pk, pv = prompting.split_kv(prompts["prompts"][i][idx])  # (B, k, L/2, D)
            prefixes[block] = (pk.reshape(batch, -1, self.width), pv.reshape(batch, -1, self.width))
            match += jnp.sum(1.0 - jnp.take_along_axis(s, idx, axis=1)) / batch
        return prefixes, (m.l2p_match_weight * match if train else None)
