"""The MPI this Python environment uses: library, version, launcher, and whether it
is CUDA-aware, with the evidence.

The library is asked in a child interpreter (:func:`in_this_process` run by
:func:`ddlcomm.machine.probe.child`), so that a broken MPI cannot hang or
crash the caller and the caller's MPI is never initialised.  The child
initialises MPI as a singleton (the launcher's variables removed from its
environment) because ``MPIX_Query_cuda_support()`` only means something after
``MPI_Init`` (MPICH aborts when asked before; Open MPI answers 0 before its
accelerator framework is chosen).  mpi4py has no wrapper for it, so it is
called through ctypes on the ``libmpi`` mpi4py loaded.  The build's own
account comes from ``ompi_info`` (Open MPI) or ``mpichversion`` and
``mpivars`` (MPICH) beside the environment's ``mpirun``.
"""
from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path
from typing import Any, Mapping, Optional

from ..errors import BackendUnavailable
from ..launch import mpirun
from . import probe

#: Environment-variable prefixes a launcher gives its ranks; a singleton child drops them.
LAUNCHER_PREFIXES = ("PMIX_", "PMI_", "PRTE_", "HYDRA_", "MPI_LOCAL", "OMPI_COMM_WORLD_",
                     "OMPI_WORLD_", "OMPI_UNIVERSE_", "OMPI_FILE_LOCATION", "OMPI_NUM_APP_CTX",
                     "OMPI_ARGV", "OMPI_COMMAND", "OMPI_TOOL_NAME", "OMPI_FIRST_RANKS", "OMPI_APP_CTX")
#: The BTLs of the Open MPI singleton child (see :func:`singleton_env`): itself only.  With
#: the shared-memory BTL it left a segment in /dev/shm at every probe (``sm_segment.*``),
#: and with ofi it looked for fabric providers for 1.0 of its 1.02 s MPI_Init.  It talks
#: to nobody, so this holds whatever the environment chose: a rank ddlcomm started has
#: :data:`ddlcomm.launch.mpirun.OPENMPI_LOCAL_BTL` (sm included) in its environment.
SINGLETON_BTL = "self"
#: MPICH's MPIX_GPU_query_support() kind for CUDA (mpi_proto.h: MPIX_GPU_SUPPORT_CUDA).
MPIX_GPU_SUPPORT_CUDA = 0


def parse_library_version(text: str) -> tuple[str, str]:
    """Split ``MPI_Get_library_version``'s text into (library name, version) (pure)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    for pattern, name in ((r"Open MPI v?([\w.\-]+)", "Open MPI"),
                          (r"MPICH Version:\s*([\w.\-]+)", "MPICH"),
                          (r"Intel\(R\) MPI Library ([\w.\-]+(?: Update \d+)?)", "Intel MPI"),
                          (r"MVAPICH2? Version\s*:?\s*([\w.\-]+)", "MVAPICH")):
        m = re.search(pattern, text)
        if m:
            return name, m.group(1)
    return (first or "unknown MPI"), ""


def singleton_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables of an enclosing launcher's job, and with Open MPI's
    BTLs cut to ``self`` (pure): the process talks to nobody, and the CUDA answer comes
    from the accelerator framework, not from a BTL."""
    env = {k: v for k, v in environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env["OMPI_MCA_btl"] = SINGLETON_BTL
    return env


# ------------------------------------------------------------ in the child
def _libmpi_path() -> Optional[str]:
    """The ``libmpi*`` shared library mapped into this process (after importing mpi4py.MPI)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths = [line.split()[-1] for line in f if "/" in line]
    except OSError:
        return None
    names = [p for p in dict.fromkeys(paths) if Path(p).name.startswith(("libmpi.", "libmpich", "libmpi_"))]
    return names[0] if names else None


def _call_int(lib: ctypes.CDLL, symbol: str) -> Optional[int]:
    """``symbol()`` of ``lib`` as an int, None when the library has no such symbol."""
    if not hasattr(lib, symbol):
        return None
    fn = getattr(lib, symbol)
    fn.restype, fn.argtypes = ctypes.c_int, []
    return int(fn())


def _gpu_query(lib: ctypes.CDLL) -> Optional[int]:
    """MPICH's ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag)`` flag, None without it."""
    if not hasattr(lib, "MPIX_GPU_query_support"):
        return None
    flag = ctypes.c_int(-1)
    code = lib.MPIX_GPU_query_support(ctypes.c_int(MPIX_GPU_SUPPORT_CUDA), ctypes.byref(flag))
    return int(flag.value) if code == 0 else None


def in_this_process() -> dict[str, Any]:
    """Run in a child: mpi4py's library, its version text, and the CUDA queries after MPI_Init."""
    try:
        import mpi4py  # mpi4py is optional: asked for only in the probe's child
    except ImportError as exc:
        return {"available": False, "reason": f"mpi4py is not installed ({exc})"}
    mpi4py.rc.initialize = False
    mpi4py.rc.thread_level = "single"
    try:
        from mpi4py import MPI  # loads the MPI library: after the rc settings above
    except (ImportError, RuntimeError) as exc:
        return {"available": False, "reason": f"mpi4py cannot load an MPI library ({exc})"}
    out: dict[str, Any] = {"available": True, "mpi4py": mpi4py.__version__,
                           "library_version_text": MPI.Get_library_version().replace("\x00", "").strip(),
                           "libmpi": _libmpi_path()}
    lib = ctypes.CDLL(out["libmpi"]) if out["libmpi"] else None
    try:
        MPI.Init()
    except Exception as exc:       # an MPI that cannot start here: said, not raised
        out["init_error"] = f"{type(exc).__name__}: {exc}"
        return out
    if lib is not None:
        out["query_cuda_support"] = _call_int(lib, "MPIX_Query_cuda_support")
        out["gpu_query_support_cuda"] = _gpu_query(lib)
    MPI.Finalize()
    return out


def cuda_aware_here() -> tuple[bool, str]:
    """In a process whose MPI is initialised (a rank): (CUDA-aware?, the evidence), from
    ``MPIX_Query_cuda_support()`` / ``MPIX_GPU_query_support`` on the loaded ``libmpi``."""
    path = _libmpi_path()
    if path is None:
        return False, "libmpi not found among this process's libraries: not asked, taken as no"
    lib = ctypes.CDLL(path)
    query, gpu = _call_int(lib, "MPIX_Query_cuda_support"), _gpu_query(lib)
    lines = query_evidence({"libmpi": path, "query_cuda_support": query,
                            "gpu_query_support_cuda": gpu})
    return bool(query) or bool(gpu), "; ".join(lines)


# ------------------------------------------------------------ the build's own account
def parse_ompi_info(text: str) -> dict[str, Any]:
    """From ``ompi_info --parsable --all`` (pure): ``version``, ``built_with_cuda``
    and ``cuda_support`` (True/False/None), the ``accelerators`` components and
    the CUDA option of the configure line (``--without-cuda``, ``--with-cuda=...``)."""
    def param(name: str) -> Optional[bool]:      # Open MPI 5: opal_*, 4.x: mpi_*
        m = re.search(rf"^mca:[^:\n]+:[^:\n]+:param:(?:opal|mpi)_{name}:value:(\w+)", text, re.M)
        return None if m is None else m.group(1).lower() in ("true", "1", "yes")
    version = re.search(r"^ompi:version:full:(\S+)", text, re.M)
    configure = re.search(r"^config:cli:(.*)$", text, re.M)
    cuda_opt = re.findall(r"--(?:with|without|enable|disable)-cuda\b[^'\s]*", configure.group(1)) if configure else []
    return {"version": version.group(1) if version else None,
            "built_with_cuda": param("built_with_cuda_support"),
            "cuda_support": param("cuda_support"),
            "accelerators": sorted(set(re.findall(r"^mca:accelerator:([^:\n]+):version:", text, re.M))),
            "configure_cuda": cuda_opt[-1] if cuda_opt else None}


def parse_mpichversion(text: str) -> dict[str, Optional[str]]:
    """``version``, ``device`` and ``configure`` from ``mpichversion``'s lines (pure)."""
    def field(name: str) -> Optional[str]:
        m = re.search(rf"^MPICH {name}:\s*(.*?)\s*$", text, re.M)
        return m.group(1) if m else None
    return {"version": field("Version"), "device": field("Device"), "configure": field("configure")}


def parse_mpivar(text: str, name: str) -> Optional[str]:
    """The value ``mpivars`` prints for control variable ``name`` (pure)."""
    m = re.search(rf"^\s*{re.escape(name)}\s*=\s*(\S+)", text, re.M)
    return m.group(1) if m else None


def ompi_evidence(tool_dir: Optional[str]) -> tuple[Optional[bool], list[str]]:
    """(built with CUDA?, evidence lines) from ``ompi_info``."""
    path = probe.which("ompi_info", tool_dir)
    if path is None:
        return None, ["ompi_info: not found beside mpirun or on PATH"]
    text, why = probe.command([path, "--parsable", "--all"])
    if why:
        return None, [f"ompi_info: {why}"]
    info = parse_ompi_info(text or "")
    line = (f"{path} --parsable --all: opal_built_with_cuda_support={_word(info['built_with_cuda'])}, "
            f"opal_cuda_support={_word(info['cuda_support'])}, accelerator components: "
            f"{', '.join(info['accelerators']) or 'none'}, configure: {info['configure_cuda'] or 'no CUDA option'}")
    return info["built_with_cuda"], [line]


def mpich_evidence(tool_dir: Optional[str]) -> tuple[Optional[bool], list[str]]:
    """(None: MPICH's build says nothing definite, evidence lines) from ``mpichversion`` and ``mpivars``."""
    lines = []
    path = probe.which("mpichversion", tool_dir)
    text, why = probe.command([path]) if path else (None, "not found beside mpirun or on PATH")
    if why:
        lines.append(f"mpichversion: {why}")
    else:
        info = parse_mpichversion(text or "")
        cuda = "with CUDA" if "cuda" in (info["configure"] or "").lower() else "no CUDA option"
        lines.append(f"{path}: device {info['device']}, configure {info['configure']} ({cuda})")
    path = probe.which("mpivars", tool_dir)
    text, why = probe.command([path]) if path else (None, "not found beside mpirun or on PATH")
    value = None if why else parse_mpivar(text or "", "MPIR_CVAR_ENABLE_GPU")
    lines.append(f"mpivars: {why}" if why else f"{path}: MPIR_CVAR_ENABLE_GPU={value}")
    return None, lines


#: The build's own account, by library name.
BUILD_EVIDENCE = {"Open MPI": ompi_evidence, "MPICH": mpich_evidence}


def _word(flag: Optional[bool]) -> str:
    return "unknown" if flag is None else str(flag).lower()


def verdict(query: Optional[int], gpu_query: Optional[int], built: Optional[bool]) -> bool | str:
    """CUDA-aware? The run-time queries decide; without them a build without CUDA
    says no; otherwise ``"unknown"`` (pure)."""
    if query is not None or gpu_query is not None:
        return bool(query) or bool(gpu_query)
    if built is False:
        return False
    return "unknown"


# ------------------------------------------------------------ the section
def launcher() -> dict[str, Any]:
    """The environment's ``mpirun`` (:func:`ddlcomm.launch.mpirun.find`): path and family."""
    try:
        found = mpirun.find()
    except BackendUnavailable as exc:
        return {"available": False, "reason": str(exc)}
    return {"available": True, "path": found.path, "family": found.family}


def query_evidence(child: Mapping[str, Any]) -> list[str]:
    """What the child's run-time queries said, as evidence lines (pure)."""
    if "init_error" in child:
        return [f"MPI_Init as a singleton failed, so MPIX_Query_cuda_support() was not asked: "
                f"{child['init_error']}"]
    where = f" (ctypes on {child.get('libmpi')})" if child.get("libmpi") else ""
    if not child.get("libmpi"):
        return ["libmpi not found among the libraries mpi4py loaded: MPIX_Query_cuda_support() not asked"]
    lines = [f"MPIX_Query_cuda_support() after MPI_Init = {child['query_cuda_support']}{where}"
             if child.get("query_cuda_support") is not None else
             f"MPIX_Query_cuda_support: no such symbol in {child['libmpi']}"]
    if child.get("gpu_query_support_cuda") is not None:
        lines.append(f"MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA) = {child['gpu_query_support_cuda']}")
    return lines


def facts() -> dict[str, Any]:
    """This environment's MPI: ``available`` (or ``reason``), ``library``, ``version``,
    ``library_version`` (first line), ``mpi4py``, ``libmpi``, ``launcher``,
    ``cuda_aware`` (true, false or "unknown") and its ``evidence`` (lines)."""
    child = probe.child("ddlcomm.machine.mpi:in_this_process", env=singleton_env(os.environ))
    if "error" in child or not child.get("available"):
        why = child.get("error") or child.get("reason")
        return {"available": False, "reason": why, "launcher": launcher(), "cuda_aware": "unknown",
                "evidence": [f"MPI probe: {why}"]}
    library, version = parse_library_version(child["library_version_text"])
    where = launcher()
    tool_dir = str(Path(where["path"]).parent) if where.get("available") else None
    built, build_lines = BUILD_EVIDENCE.get(library, lambda d: (None, [f"no build report known for {library}"]))(tool_dir)
    return {"available": True, "library": library, "version": version,
            "library_version": child["library_version_text"].splitlines()[0],
            "mpi4py": child.get("mpi4py"), "libmpi": child.get("libmpi"), "launcher": where,
            "cuda_aware": verdict(child.get("query_cuda_support"), child.get("gpu_query_support_cuda"), built),
            "evidence": query_evidence(child) + build_lines}
