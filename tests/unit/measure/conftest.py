from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kubeseer.measure import plans

REPO = Path(__file__).resolve().parents[3]
TINY_PLAN = REPO / "plans" / "tiny.yaml"


@pytest.fixture(autouse=True, scope="package")
def single_intra_op_thread() -> Iterator[None]:
    """Measure on one thread, as the harness does by default, and restore the default after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="package")
def tiny_plan() -> plans.Plan:
    return plans.load_plan(TINY_PLAN)


@pytest.fixture(scope="package")
def tiny_expansion(tiny_plan: plans.Plan) -> plans.Expansion:
    return plans.expand(tiny_plan)
