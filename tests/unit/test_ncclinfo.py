"""Tests of ddlcomm.comm.ncclinfo: NCCL's shared-GPU variables and its transport lines (pure).

The log lines below follow the format NCCL documents and prints at
``NCCL_DEBUG=INFO`` ("Channel CC/N : R[D] -> R[D] via TRANSPORT"); they were
written from that format, not captured on a GPU here.
"""
from __future__ import annotations

import pytest

from ddlcomm.comm import ncclinfo
from ddlcomm.errors import UnsupportedError


@pytest.mark.parametrize("text, want", [
    ("2.28.9", (2, 28, 9)), ("NCCL version 2.30.1+cuda13.0", (2, 30, 1)),
    ("2.28.9 (torch 2.11.0+cu130)", (2, 28, 9)), ("", None), (None, None), ("nccl", None)])
def test_parse_version(text, want):
    assert ncclinfo.parse_version(text) == want


def test_one_rank_per_gpu_needs_nothing():
    got = ncclinfo.shared_gpu_env((2, 28, 9), 1, 0, "h", {})
    assert got.env == {} and got.how == "one rank per GPU"
    assert ncclinfo.shared_gpu_env(None, 1, 3, "h", {"NCCL_HOSTID": "x"}).env == {}


@pytest.mark.parametrize("version", [(2, 30, 0), (2, 31, 2), (3, 0, 0)])
def test_nccl_2_30_and_later_share_the_gpu_when_told(version):
    got = ncclinfo.shared_gpu_env(version, 4, 2, "h", {})
    assert got.env == {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    assert "NCCL_MULTI_RANK_GPU_ENABLE=1" in got.how


def test_nccl_2_30_refuses_when_the_user_turned_sharing_off():
    with pytest.raises(UnsupportedError, match="NCCL_MULTI_RANK_GPU_ENABLE=0"):
        ncclinfo.shared_gpu_env((2, 30, 0), 2, 0, "h", {"NCCL_MULTI_RANK_GPU_ENABLE": "0"})


@pytest.mark.parametrize("version", [(2, 28, 9), (2, 29, 9), (2, 18, 1)])
def test_before_2_30_each_rank_of_a_gpu_gets_its_own_host_id(version):
    ids = {ncclinfo.shared_gpu_env(version, 4, slot, "gpubox", {}).env["NCCL_HOSTID"]
           for slot in range(4)}
    assert len(ids) == 4 and all(i.startswith("gpubox-") for i in ids)
    # the k-th rank of every GPU shares a host id: ranks of different GPUs keep P2P
    assert ncclinfo.shared_gpu_env(version, 2, 1, "gpubox", {}).env["NCCL_HOSTID"] == \
        ncclinfo.shared_gpu_env(version, 3, 1, "gpubox", {}).env["NCCL_HOSTID"]
    assert "NCCL_HOSTID per rank of a GPU" in ncclinfo.shared_gpu_env(version, 2, 0, "h", {}).how
    # one host per rank to NCCL: its multi-node NVLink search is off, unless the user chose
    assert ncclinfo.shared_gpu_env(version, 2, 0, "h", {}).env["NCCL_MNNVL_ENABLE"] == "0"
    assert "NCCL_MNNVL_ENABLE" not in ncclinfo.shared_gpu_env(
        version, 2, 0, "h", {"NCCL_MNNVL_ENABLE": "1"}).env


def test_before_2_30_a_common_host_id_is_refused_with_the_reason():
    with pytest.raises(UnsupportedError) as err:
        ncclinfo.shared_gpu_env((2, 28, 9), 2, 1, "h", {"NCCL_HOSTID": "same"})
    assert "2 ranks share one GPU" in str(err.value) and "NCCL_HOSTID=same" in str(err.value)
    assert "2.28.9" in str(err.value) and "unset NCCL_HOSTID" in err.value.hint


def test_unknown_version_with_shared_gpu_is_refused():
    with pytest.raises(UnsupportedError, match="cannot tell NCCL's version"):
        ncclinfo.shared_gpu_env(None, 2, 0, "h", {})


def test_debug_env_keeps_the_users_choice():
    assert ncclinfo.debug_env({}) == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": ncclinfo.DEFAULT_LOG}
    assert ncclinfo.debug_env({"NCCL_DEBUG_FILE": "/x/%p"})["NCCL_DEBUG_FILE"] == "/x/%p"
    assert ncclinfo.debug_env({"NCCL_DEBUG": "WARN"}) == {}


def test_log_path_expands_host_and_pid():
    assert ncclinfo.log_path({"NCCL_DEBUG_FILE": "/tmp/n.%h.%p.log"}, "box", 42) == "/tmp/n.box.42.log"
    assert ncclinfo.log_path({}, "box", 42) is None


def test_log_path_uses_the_short_host_name_as_nccl_does():
    # NCCL's %h is gethostname() cut at the first '.' (debug.cc: getHostName(hostname, 1024, '.'))
    got = ncclinfo.log_path({"NCCL_DEBUG_FILE": "/tmp/n.%h.%p.log"}, "gpu7.cluster.example", 42)
    assert got == "/tmp/n.gpu7.42.log"


# NCCL's documented INFO format; samples written here, not captured on a GPU.
SAMPLE = """\
gpubox:1234:1301 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
gpubox:1234:1301 [0] NCCL INFO Channel 00/02 :    0   1
gpubox:1234:1301 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via P2P/IPC
gpubox:1234:1301 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] via P2P/IPC
gpubox:1235:1302 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] via SHM/direct/direct
gpubox:1235:1302 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] via P2P/CUMEM/read
gpubox:1236:1303 [0] NCCL INFO Channel 00/0 : 2[0] -> 3[0] [send] via NET/Socket/0
gpubox:1236:1303 [0] NCCL INFO Channel 00/0 : 3[0] -> 2[0] [receive] via NET/Socket/0
gpubox:1237:1304 [0] NCCL INFO Channel 00 : 4[65000] -> 5[66000] via P2P/direct pointer
gpubox:1238:1305 [0] NCCL INFO Channel 00/0 : 6[0] -> 7[0] via P2P/direct pointer/read \n
gpubox:1237:1304 [0] NCCL INFO Connected all rings
"""


def test_parse_transports_reads_every_pair():
    pairs = ncclinfo.parse_transports(SAMPLE.splitlines())
    assert pairs == {"0->1": "P2P/IPC", "1->0": "SHM/direct/direct+P2P/CUMEM/read",
                     "2->3": "NET/Socket/0", "3->2": "NET/Socket/0",
                     "4->5": "P2P/direct pointer", "6->7": "P2P/direct pointer/read"}
    assert ncclinfo.transport_kinds(pairs) == ["NET/Socket/0", "P2P/CUMEM/read", "P2P/IPC",
                                               "P2P/direct pointer", "P2P/direct pointer/read",
                                               "SHM/direct/direct"]


def test_parse_transports_of_nothing():
    assert ncclinfo.parse_transports(["NCCL INFO Bootstrap : Using lo:127.0.0.1<0>", ""]) == {}
    assert ncclinfo.transport_kinds({}) == []


@pytest.mark.parametrize("template, want", [
    ("/tmp/n.%%h.%p", "/tmp/n.%h.42"),             # %% is one %, not the start of %h
    ("/tmp/100%%/%h", "/tmp/100%/box"),
    ("/tmp/%x%h", "/tmp/%xbox"),                   # an unknown field is kept as written
    ("/tmp/%p%p.log", "/tmp/4242.log"),
    ("/tmp/end%", "/tmp/end%"),
])
def test_log_path_expands_in_one_pass_as_nccl_does(template, want):
    # NCCL 2.28.9 src/debug.cc (ncclDebugInit): one scan; '%%' -> '%', 'h', 'p', else echoed.
    assert ncclinfo.log_path({"NCCL_DEBUG_FILE": template}, "box", 42) == want
