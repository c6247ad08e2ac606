"""The GPUs and the GPU software: torch, its CUDA, NCCL, CuPy, the devices (name,
memory, PCI bus id), NVIDIA MPS, and how many ranks would share each GPU.

torch is asked in a child interpreter (:func:`in_this_process` through
:func:`ddlcomm.machine.probe.child`): importing it takes a second or two, and
asking for device properties creates a CUDA context, which the caller (an owner
about to start ranks, or a rank) must not pay for or hold.  ``nvidia-smi``,
when present, answers without torch.  On a machine with no NVIDIA device at
all (no ``/dev/nvidia*``, no ``nvidia-smi``) torch is not imported: its
version and CUDA build are read from its ``torch/version.py``, and no GPU is
what it would have said.  Ranks go to GPUs by
:func:`ddlcomm.memory.gpu.gpu_of`: local rank r on GPU ``r % gpus``.
"""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Optional

from . import probe

NVIDIA_SMI_QUERY = "index,name,memory.total,pci.bus_id,driver_version"
#: Where NVIDIA's MPS control daemon puts its pipes unless CUDA_MPS_PIPE_DIRECTORY says otherwise.
MPS_PIPE_DIR = "/tmp/nvidia-mps"
#: Files whose presence means an NVIDIA driver exposes a device here (WSL: /dev/dxg).
DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")
#: A file keeping torch's answer for a series of runs (scripts/gpu-check sets it): the first
#: probe writes it, the next ones read it instead of importing torch and starting CUDA again.
TORCH_FACTS_ENV = "DDLCOMM_TORCH_FACTS"
#: Seconds the torch child may take: a cold import of torch with its CUDA libraries and
#: the first CUDA context on a fresh machine can pass the default 20 s.
TORCH_CHILD_TIMEOUT_S = 60.0


def ranks_per_gpu(ranks: int, gpus: int) -> list[int]:
    """How many of ``ranks`` local ranks share each of ``gpus`` GPUs under
    :func:`ddlcomm.memory.gpu.gpu_of` (pure)."""
    if gpus < 1:
        return []
    return [ranks // gpus + (1 if g < ranks % gpus else 0) for g in range(gpus)]


def bus_id(domain: int, bus: int, device: int) -> str:
    """A PCI bus id in nvidia-smi's form, ``00000000:65:00.0`` (pure)."""
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


def _dotted(version: Any) -> str:
    """NCCL's version as ``2.28.9`` from a tuple or an int: 22809 (since 2.9, X*10000 +
    Y*100 + Z) or 2708 (before, X*1000 + Y*100 + Z)."""
    if isinstance(version, (tuple, list)):
        return ".".join(str(v) for v in version)
    if isinstance(version, int) and version >= 10000:
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    if isinstance(version, int) and version >= 1000:
        return f"{version // 1000}.{version // 100 % 10}.{version % 100}"
    return str(version)


def _device(torch: Any, index: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    ids = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    return {"index": index, "name": props.name, "memory_bytes": int(props.total_memory),
            "bus_id": bus_id(*ids) if None not in ids else None,
            "capability": f"{props.major}.{props.minor}", "source": "torch"}


def in_this_process() -> dict[str, Any]:
    """Run in a child: torch's version, CUDA build, NCCL, and each visible device."""
    try:
        import torch      # optional dependency, and slow: only in this child
    except ImportError as exc:
        return {"torch": None, "reason": f"torch is not installed ({exc})"}
    out: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                           "cuda_available": bool(torch.cuda.is_available()), "devices": []}
    try:
        out["nccl"] = _dotted(torch.cuda.nccl.version())
    except Exception as exc:          # CPU builds have no NCCL: say why
        out["nccl_reason"] = f"torch.cuda.nccl.version(): {type(exc).__name__}: {exc}"
    if out["cuda_available"]:
        out["devices"] = [_device(torch, i) for i in range(torch.cuda.device_count())]
    return out


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """Devices from ``nvidia-smi --query-gpu=<NVIDIA_SMI_QUERY> --format=csv,noheader,nounits`` (pure)."""
    devices = []
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        index, name, mib, bus, driver = cells
        devices.append({"index": int(index), "name": name,
                        "memory_bytes": int(mib) << 20 if mib.isdigit() else None,
                        "bus_id": bus, "driver": driver, "source": "nvidia-smi"})
    return devices


def nvidia_smi() -> dict[str, Any]:
    """The devices as ``nvidia-smi`` sees them, or why not."""
    path = probe.which("nvidia-smi")
    if path is None:
        return {"available": False, "reason": "nvidia-smi not found (no NVIDIA driver here)"}
    text, why = probe.command([path, f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits"])
    if why:
        return {"available": False, "reason": why}
    return {"available": True, "path": path, "devices": parse_nvidia_smi(text or "")}


def wheel(prefixes: tuple[str, ...]) -> Optional[dict[str, str]]:
    """The first installed distribution whose name is or starts with one of ``prefixes``:
    ``{"name", "version"}`` (read from its metadata, nothing imported), else None."""
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if any(name == p or name.startswith(p + "-") for p in prefixes):
            return {"name": name, "version": dist.version}
    return None


def nccl(child: dict[str, Any]) -> dict[str, Any]:
    """NCCL's version: torch's own when it has one, else an ``nvidia-nccl-*`` wheel's, else why not."""
    if child.get("nccl"):
        return {"version": child["nccl"], "source": "torch.cuda.nccl.version()"}
    found = wheel(("nvidia-nccl",))
    if found:
        return {"version": found["version"], "source": f"the {found['name']} wheel"}
    return {"version": None, "reason": child.get("nccl_reason") or "no NCCL in torch and no nvidia-nccl wheel"}


def mps(pipe_dir: Optional[str] = None) -> dict[str, Any]:
    """Whether NVIDIA's MPS daemon is running (its control pipe exists), and its tools."""
    where = Path(pipe_dir or os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DIR)
    return {"running": (where / "control").exists(), "pipe_dir": str(where),
            "control": probe.which("nvidia-cuda-mps-control")}


def parse_torch_version_file(text: str) -> dict[str, Any]:
    """``torch`` (``__version__``) and ``cuda`` from the text of ``torch/version.py`` (pure)."""
    values: dict[str, Any] = {}
    for node in ast.parse(text).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id in ("__version__", "cuda") and node.value is not None:
            try:
                values[target.id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return {"torch": values.get("__version__"), "cuda": values.get("cuda")}


def nvidia_device() -> Optional[str]:
    """What shows an NVIDIA device here (a device file or nvidia-smi), None if nothing does."""
    return next((f for f in DEVICE_FILES if os.path.exists(f)), None) or probe.which("nvidia-smi")


def torch_facts() -> dict[str, Any]:
    """torch's answer from a child (with :data:`TORCH_FACTS_ENV` naming a file: asked once,
    kept there for the runs that follow); without any NVIDIA device, its build read from
    ``torch/version.py`` instead (no import); without torch, why not."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {"torch": None, "reason": "torch is not installed", "devices": []}
    if nvidia_device() is None:
        version_file = Path(list(spec.submodule_search_locations)[0]) / "version.py"
        try:
            build = parse_torch_version_file(version_file.read_text())
        except (OSError, SyntaxError) as exc:
            return {"torch": None, "reason": f"cannot read {version_file}: {exc}", "devices": []}
        return dict(build, cuda_available=False, devices=[],
                    reason=f"no NVIDIA device ({', '.join(DEVICE_FILES)} absent, no nvidia-smi)",
                    how=f"not imported (no NVIDIA device); its build read from {version_file}")
    cache = os.environ.get(TORCH_FACTS_ENV)
    if cache:
        try:
            return json.loads(Path(cache).read_text())
        except (OSError, ValueError):
            pass
    answer = dict(probe.child("ddlcomm.machine.gpus:in_this_process",
                              timeout_s=TORCH_CHILD_TIMEOUT_S), how="asked in a child interpreter")
    if cache and "error" not in answer:
        try:
            kept = dict(answer, how=f"asked in a child interpreter once, kept in {cache}")
            Path(cache).write_text(json.dumps(kept))
        except OSError:
            pass
    return answer


def facts(ranks: Optional[int] = None) -> dict[str, Any]:
    """``torch``, ``cuda`` (torch's build), ``cuda_available``, ``nccl``, ``cupy``,
    ``driver``, ``devices`` (index, name, memory_bytes, bus_id), ``count``, ``mps``;
    with ``ranks``, ``ranks_per_gpu`` (one count per GPU) and ``shared``."""
    child = torch_facts()
    smi = nvidia_smi()
    devices = child.get("devices") or smi.get("devices") or []
    out: dict[str, Any] = {
        "torch": child.get("torch"), "cuda": child.get("cuda"),
        "cuda_available": bool(child.get("cuda_available")),
        "nccl": nccl(child), "cupy": wheel(("cupy",)),
        "driver": next((d.get("driver") for d in smi.get("devices", []) if d.get("driver")), None),
        "devices": devices, "count": len(devices), "nvidia_smi": smi, "mps": mps(),
        "torch_probe": child.get("how"),
    }
    if child.get("error"):      # the torch child timed out or died: said, even beside nvidia-smi's devices
        out["torch_error"] = child["error"]
    if not devices:
        out["reason"] = (child.get("error") or child.get("reason") or
                         ("torch sees no CUDA device" if child.get("torch") else smi.get("reason")))
    if ranks is not None:
        out["ranks"] = ranks
        out["ranks_per_gpu"] = ranks_per_gpu(ranks, len(devices))
        out["shared"] = max(out["ranks_per_gpu"], default=0) > 1
    return out
