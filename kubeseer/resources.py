"""The files kubeseer ships beside its code: CRDs, RBAC, scheduler configuration, examples, the
control-plane build script and its pinned versions.

In a checkout they are the repository's own `deploy/`, `examples/` and `hack/`, so an edit there
takes effect at once. An installed wheel carries copies of the same directories as package data
under `kubeseer/_data/`, made from the tree when the wheel is built (see pyproject.toml), so
`kubeseer demo`, `devcluster up` and `operator run` work outside the source tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

_PACKAGE: Final[Path] = Path(__file__).resolve().parent
CHECKOUT: Final[Path] = _PACKAGE.parent
"""The repository root when kubeseer runs from a checkout (meaningless when installed)."""

PACKAGE_DATA: Final[Path] = _PACKAGE / "_data"
"""Where a built wheel keeps its copies of `SHIPPED`."""

SHIPPED: Final[tuple[str, ...]] = ("deploy", "examples", "hack")
"""The top-level directories of the repository that kubeseer reads at run time."""


def from_checkout() -> bool:
    """Whether kubeseer runs from a source checkout (editable install or `python -m`)."""
    return (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "deploy").is_dir()


def root() -> Path:
    """The directory holding `deploy/`, `examples/` and `hack/`: the checkout or the copies."""
    return CHECKOUT if from_checkout() else PACKAGE_DATA


def path(*parts: str) -> Path:
    """A shipped file or directory, e.g. ``path("deploy", "crds")``."""
    return root().joinpath(*parts)
