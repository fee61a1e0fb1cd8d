import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a loaded two-core machine
    OpenMP's spinning workers make them 30x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
