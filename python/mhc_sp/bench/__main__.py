# SPDX-License-Identifier: Apache-2.0
"""``python -m mhc_sp.bench`` = the ``mhc-sp-bench`` console script."""

from .cli import main

raise SystemExit(main())
