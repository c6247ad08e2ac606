"""Tests of the backend registry (ddlcomm.comm.registry), without starting a backend."""
from __future__ import annotations

import sys

import pytest

from ddlcomm.comm import registry
from ddlcomm.comm.registry import BackendSpec
from ddlcomm.errors import BackendUnavailable, UsageError

MISSING = "ddlcomm_no_such_module_xyz"


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    """Each test sees the built-in backends and no plugins already loaded."""
    monkeypatch.setattr(registry, "BACKENDS", dict(registry.BACKENDS))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    monkeypatch.delenv("DDLCOMM_PLUGINS", raising=False)


def test_mpi_is_registered():
    spec = registry.get_spec("mpi")
    assert spec.target == "ddlcomm.comm.mpi:MPICommunicator" and "mpi4py" in spec.requires


def test_unknown_backend_names_the_choices():
    with pytest.raises(UsageError) as err:
        registry.get_spec("nope")
    assert "unknown backend 'nope'" in str(err.value)
    assert err.value.hint == f"choose from {', '.join(registry.BACKENDS)}"
    with pytest.raises(UsageError):
        registry.check("nope")


def test_check_missing_module_gives_the_install_hint():
    registry.register(BackendSpec("fake", "ddlcomm_fake:Comm", ("numpy", MISSING),
                                  "pip install fake-comm", ("mpirun",)))
    with pytest.raises(BackendUnavailable) as err:
        registry.check("fake")
    assert "fake" in str(err.value) and repr(MISSING) in str(err.value)
    assert err.value.hint == "pip install fake-comm"
    with pytest.raises(BackendUnavailable):
        registry.create("fake")


def test_check_passes_when_modules_are_present():
    spec = BackendSpec("fake", "ddlcomm_fake:Comm", ("numpy",), "pip install fake-comm", ("mpirun",))
    registry.register(spec)
    assert registry.check("fake") is spec


def test_missing_plugin_module(monkeypatch):
    monkeypatch.setenv("DDLCOMM_PLUGINS", f" , {MISSING} ")
    with pytest.raises(BackendUnavailable) as err:
        registry.get_spec("mpi")
    assert repr(MISSING) in str(err.value) and "DDLCOMM_PLUGINS" in str(err.value)
    assert "DDLCOMM_PLUGINS" in err.value.hint


def test_plugin_registers_a_backend(monkeypatch, tmp_path):
    (tmp_path / "ddlcomm_test_plugin.py").write_text(
        "from ddlcomm.comm.registry import BackendSpec, register\n"
        "register(BackendSpec('plug', 'ddlcomm_test_plugin:Comm', (), 'n/a', ('mpirun',)))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DDLCOMM_PLUGINS", "ddlcomm_test_plugin")
    try:
        assert registry.get_spec("plug").target == "ddlcomm_test_plugin:Comm"
        assert "plug" in str(pytest.raises(UsageError, registry.get_spec, "nope").value)
    finally:
        sys.modules.pop("ddlcomm_test_plugin", None)


def test_nccl_is_registered_with_its_gpu_check():
    spec = registry.get_spec("nccl")
    assert spec.target == "ddlcomm.comm.nccl:NCCLCommunicator"
    assert spec.check == "ddlcomm.comm.nccl:check_here" and spec.memories == ("device",)
    assert registry.get_spec("gloo").memories == ("host", "device")
    assert registry.get_spec("mpi").memories == ("host",) and registry.get_spec("mpi").device_if_cuda_aware


def test_a_backends_own_check_runs_after_its_modules(monkeypatch):
    def refuse():
        raise BackendUnavailable("backend fake needs a CUDA GPU: none here")
    monkeypatch.setattr(sys.modules[__name__], "refuse_here", refuse, raising=False)
    registry.register(BackendSpec("fake", "ddlcomm_fake:Comm", ("numpy",), "hint", ("mpirun",),
                                  check=f"{__name__}:refuse_here"))
    with pytest.raises(BackendUnavailable, match="needs a CUDA GPU"):
        registry.check("fake")


def test_nccl_without_a_gpu_is_one_clear_line():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(BackendUnavailable) as err:
        registry.check("nccl")
    assert str(err.value).startswith("backend nccl needs a CUDA GPU: torch.cuda.is_available() is False")


def test_backends_that_hold_one_thing_cannot_run_together():
    registry.check_together(["mpi", "gloo"])
    registry.check_together(["mpi", "nccl"])
    with pytest.raises(UsageError) as err:
        registry.check_together(["gloo", "mpi", "nccl"])
    assert "backends gloo and nccl cannot run in one run" in str(err.value)
    assert "default process group" in str(err.value)


def test_an_option_called_name_is_refused_not_confused_with_the_backend():
    """create's own parameter is positional-only: init("mpi", name=1) is the backend's
    unknown option, one clear error (found by the bad-input suite: it was a TypeError)."""
    with pytest.raises(UsageError, match="unexpected keyword argument 'name'"):
        registry.create("mpi", name=1)
