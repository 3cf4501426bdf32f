# SPDX-License-Identifier: Apache-2.0
"""``mhc-sp-bench``: command-line benchmarks and checks. Each subcommand lives in a module of this
package named ``*_cmd`` with a ``register(subparsers)`` function; ``cli`` discovers them, so
adding a subcommand means adding a module, nothing else."""
