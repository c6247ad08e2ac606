"""What a buffer is to a Communicator (comm/buffers.py): checks and overlaps, no MPI."""
import numpy as np
import pytest

from ddlcomm.comm import buffers
from ddlcomm.errors import UsageError

try:
    import torch
except ImportError:             # the host half runs without it
    torch = None


def test_arrays_overlap_where_they_share_bytes():
    a = np.arange(8, dtype=np.float32)
    assert buffers.overlap(a[0:4], a[2:6])
    assert not buffers.overlap(a[0:4], a[4:8])
    assert not buffers.overlap(a, np.arange(8, dtype=np.float32))


def test_only_the_send_buffer_itself_may_share_its_bytes():
    a = np.arange(8, dtype=np.float32)
    buffers.check_apart(a, a, "x")
    buffers.check_apart(a[4:], a[:4], "x")
    for view in (a.reshape(2, 4), a[2:6]):
        with pytest.raises(UsageError, match="^x overlaps the send buffer ") as err:
            buffers.check_apart(view, a, "x")
        assert "pass the send buffer itself as recvbuf" in err.value.hint


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_tensors_and_arrays_overlap_where_they_share_bytes():
    t = torch.arange(8, dtype=torch.float32)
    assert buffers.overlap(t[0:4], t[2:6])
    assert buffers.overlap(t[0:4], t.numpy()[3:5])          # a view of the same memory
    assert not buffers.overlap(t[0:4], t[4:8])
    assert not buffers.overlap(t[0:4], t.numpy()[4:8])


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_a_tensor_that_requires_grad_is_refused_with_the_way_out():
    with pytest.raises(UsageError, match="require grad.*detach"):
        buffers.check_tensor(torch.ones(4, requires_grad=True))
    assert buffers.check_tensor(torch.ones(4, requires_grad=True).detach()).name == "float32"


def test_a_contiguous_copy_of_a_strided_buffer():
    strided = np.arange(8.0)[::2]
    copy = buffers.contiguous(strided)
    assert copy.flags.c_contiguous and np.array_equal(copy, [0, 2, 4, 6])
    with pytest.raises(UsageError, match="NumPy arrays or torch tensors"):
        buffers.contiguous([1.0, 2.0])
    if torch is not None:
        got = buffers.contiguous(torch.ones(8, requires_grad=True)[::2])
        assert got.is_contiguous() and not got.requires_grad
