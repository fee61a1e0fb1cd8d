"""The one build step pyproject.toml cannot declare: the wheel carries deploy/, examples/ and
hack/ as package data under kubeseer/_data/, copied from the tree when the wheel is built.

The tree stays the one source of those files (other work edits deploy/ in place); an installed
kubeseer finds the copies through `kubeseer.resources`, a checkout its own directories.
tests/integration/test_wheel_install.py checks that the wheel's copies equal the tree's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("deploy", "examples", "hack")  # kubeseer.resources.SHIPPED


class BuildPyWithShippedFiles(build_py):
    """`build_py`, then the shipped directories copied into the built package."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "kubeseer" / "_data"
        for name in SHIPPED:
            shutil.copytree(
                ROOT / name,
                target / name,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )


setup(cmdclass={"build_py": BuildPyWithShippedFiles})
