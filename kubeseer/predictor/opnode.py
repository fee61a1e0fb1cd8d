"""The read-only view of an operator that the graph rules (`attention`, `autocast`) take.

`analytic_memory.OpNode` is one; the rules take the protocol so that they need not import the
estimator they serve.
"""

from __future__ import annotations

from typing import Protocol


class Operator(Protocol):
    """An operator's type and sizes: what pattern and precision rules read."""

    @property
    def op_type(self) -> str: ...

    @property
    def output_elements(self) -> int: ...

    @property
    def weight_elements(self) -> int: ...

    @property
    def rank(self) -> int:
        """Dimensions of its first output; 0 where the graph did not record them."""
        ...
