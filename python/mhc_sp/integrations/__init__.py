# SPDX-License-Identifier: Apache-2.0
"""mhc_sp inside serving engines, as their own plugin mechanisms load it.

* ``mhc_sp.integrations.vllm``: a ``vllm.general_plugins`` entry point (named ``mhc_sp``) that
  gives vLLM's DeepSeek-V4 on the CPU platform ``sp_threshold`` sequence parallelism through the
  fused boundaries (docs/engines.md, "The vLLM plugin").

Importing this package imports nothing of any engine.
"""
