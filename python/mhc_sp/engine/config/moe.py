# SPDX-License-Identifier: Apache-2.0
"""The MoE backends of ``mhc_sp.engine.model.moe`` and the rule that ties them to sequence
parallelism.

An engine that runs sequence parallel keeps the FFN's activations token-sharded, so its MoE runs
on this rank's tokens only (DeepGEMM MegaMoE with expert parallelism, for example), and it enables
SP only with a backend that can. This model is simpler: the boundary before the FFN all-gathers
``layer_input``, so every backend here receives the whole batch, SP on or off. The table keeps the
engine's rule anyway, so a configuration accepted here is one the engine would accept:

* ``"naive"`` routes and computes each token on its own, so its output for a token does not depend
  on which other tokens share the call: it is valid on any token shard.
* ``"capacity"`` lets each expert take at most a fixed number of tokens, in token order, so which
  tokens it drops depends on the whole batch. On a token shard it would drop other tokens than the
  unsharded model does: with SP enabled it is refused.
"""

from __future__ import annotations

#: Backend name -> whether it may run with sequence parallelism (valid on a token shard).
MOE_BACKEND_SUPPORTS_SP: dict[str, bool] = {"naive": True, "capacity": False}


def check_moe_backend(backend: str, enable_sp: bool) -> None:
    """Raise ValueError for an unknown backend, NotImplementedError when ``enable_sp`` (SP is
    configured: tp > 1 and ``sp_threshold`` set) and ``backend`` is not valid on a token shard."""
    if backend not in MOE_BACKEND_SUPPORTS_SP:
        raise ValueError(
            f"moe_backend: unknown backend {backend!r}; expected one of "
            f"{sorted(MOE_BACKEND_SUPPORTS_SP)}"
        )
    if enable_sp and not MOE_BACKEND_SUPPORTS_SP[backend]:
        raise NotImplementedError(
            f"moe_backend={backend!r} does not support sequence parallelism: which tokens it "
            f"drops depends on the whole batch, so it is not valid on a token shard (SP is enabled "
            f"by sp_threshold with tensor_parallel_size > 1; use moe_backend='naive' or unset "
            f"sp_threshold)"
        )
