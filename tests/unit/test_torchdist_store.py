"""``env://``'s store (ddlcomm.comm.torchdist._env_store), in one process, no ranks.

Each join gets keys of its own (a prefix), over one store opened at the first join and
kept: rank 0 opening a new server on the port while the last still listened let a fast
rank reach the old one as it closed, and both waited for ever (2 of 40 runs of 20 joins
under the old code; tests/mpi/test_gloo.py re-joins under real ranks).
"""
from __future__ import annotations

import datetime
import socket

import pytest

from ddlcomm.launch.env import LaunchInfo
from ddlcomm.launch.spawn import held_port

pytest.importorskip("torch")


@pytest.fixture
def port():
    with held_port() as number:
        yield number


def test_each_join_has_its_own_keys_over_one_store(monkeypatch, port):
    from ddlcomm.comm import torchdist
    torchdist._import_torch("gloo")
    monkeypatch.setattr(torchdist, "_ENV_STORES", {})
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    info, timeout = LaunchInfo("torchrun", 0, 1, 0), datetime.timedelta(seconds=5)
    first = torchdist._env_store(info, timeout)
    second = torchdist._env_store(info, timeout)
    assert len(torchdist._ENV_STORES) == 1            # one server, kept
    first.set("key", "1")
    assert not second.check(["key"])                  # the next join does not see the last one's keys
    second.set("key", "2")
    assert first.get("key") == b"1" and second.get("key") == b"2"


def test_a_held_port_is_handed_to_no_one_else_but_the_store_binds_it(port):
    import torch.distributed as dist
    for _ in range(200):                                 # the OS's picks pass it over
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            assert s.getsockname()[1] != port
    with socket.socket() as s, pytest.raises(OSError):  # a plain bind is refused
        s.bind(("127.0.0.1", port))
    store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=datetime.timedelta(seconds=5))
    store.set("k", "v")
    assert store.get("k") == b"v"
