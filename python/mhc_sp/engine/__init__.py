# SPDX-License-Identifier: Apache-2.0
"""The serving-engine simulation that drives the ops the way an engine does (docs/design.md §3):

* ``config``: the engine's configuration (model, parallel, compilation, MoE rules, engine
  arguments);
* ``model``: a small DeepSeek-V4-style model whose layers call the ops;
* ``runner``: one rank's pipeline stage, its plan, CUDA graphs and MTP draft steps.

The library itself (``mhc_sp.ops``, ``mhc_sp.distributed``, ``mhc_sp.compat``) imports nothing
from here; the simulation and the command-line tool (``mhc_sp.bench``) import the library.
"""
