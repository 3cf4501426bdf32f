# SPDX-License-Identifier: Apache-2.0
"""The README's promises: it opens with the two commands a new user runs, CI runs its test
command verbatim, and the files it points to exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]


def test_readme_opens_with_the_setup_and_test_commands():
    assert README.index("```bash") < README.index("## "), "the two commands must come first"
    main_job, tests = readme_commands()
    assert main_job.startswith("bash scripts/bootstrap.sh && ") and "mhc-sp-bench" in main_job
    assert tests.startswith("bash scripts/bootstrap.sh && ") and "pytest" in tests


def test_ci_runs_the_readme_test_command_verbatim():
    _, tests = readme_commands()
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert tests in ci, ".ci/run must run the README's test command verbatim"


def test_readme_points_to_the_design_in_the_repository():
    assert "docs/design.md" in README
    assert (ROOT / "docs" / "design.md").is_file()


def test_paths_the_readme_names_exist():
    tops = ("csrc/", "python/", "tests/", "bench/", "docs/", "scripts/", "examples/", ".ci/")
    named = {m for m in re.findall(r"`([^`\s]+)`", README) if m.startswith(tops)}
    assert len(named) >= 10, named
    missing = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists())
    assert not missing, f"README names files that do not exist: {missing}"
