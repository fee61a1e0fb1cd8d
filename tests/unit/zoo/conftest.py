from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def single_intra_op_thread() -> Iterator[None]:
    """Run the zoo's tiny models on one thread.

    Their kernels are microseconds long, so a second intra-op thread only adds spin-waiting,
    which on a loaded CI machine makes a 0.1 s step take seconds. Restored afterwards so other
    packages' tests see the process default.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
