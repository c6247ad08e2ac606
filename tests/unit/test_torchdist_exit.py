"""What ddlcomm does at exit with the process group it made (torchdist._destroy_ours), in
one process, no ranks: destroyed at a clean exit, left where its backend refused to start
(NCCL's refusal: since torch 2.6 destroying an NCCL group finalizes it, which may wait for
peers that are gone).  The group's calls are replaced by recorders: this is the hook's
logic alone; tests/mpi/test_gloo.py ends real ranks' groups."""
from __future__ import annotations

import sys

import pytest

pytest.importorskip("torch")


def test_ddlcomms_group_is_destroyed_at_exit_unless_left(monkeypatch):
    from ddlcomm.comm import torchdist
    torchdist._import_torch("gloo")
    destroyed = []
    monkeypatch.delattr(sys, "last_value", raising=False)     # pytest sets it after a failure
    monkeypatch.setattr(torchdist.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(torchdist.dist, "destroy_process_group", lambda: destroyed.append(1))
    monkeypatch.setitem(torchdist._OURS, "made", True)
    torchdist._destroy_ours()
    assert destroyed == [1]
    monkeypatch.setitem(torchdist._OURS, "made", True)
    torchdist.leave_at_exit()
    torchdist._destroy_ours()
    assert destroyed == [1]
