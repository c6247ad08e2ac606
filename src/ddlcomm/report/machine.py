"""``ddlcomm info`` as text: one labelled block per section of :func:`ddlcomm.machine.facts`."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from ..units import format_size

Facts = Mapping[str, Any]
INDENT = " " * 10


def _size(nbytes: Optional[int]) -> str:
    return "?" if nbytes is None else format_size(nbytes)


def _avail(feature: Mapping[str, Any]) -> str:
    """``yes`` or ``no (reason)``, or the probe's error."""
    if "error" in feature:
        return f"unknown ({feature['error']})"
    return "yes" if feature.get("available") else f"no ({feature.get('reason') or 'unavailable'})"


def _on_cores(c: Facts) -> str:
    """`` on N physical cores`` where the facts say (older facts do not)."""
    return f" on {c['physical_cores']} physical cores" if c.get("physical_cores") else ""


def _cpus(c: Facts) -> list[str]:
    lines = [f"{c.get('model') or 'unknown CPU'}, {c.get('logical')} logical CPUs{_on_cores(c)}, "
             f"this process may use {c.get('usable')} ({c.get('affinity')}), "
             f"last-level cache {_size(c.get('last_level_cache_bytes'))}"]
    if c.get("usable_cores") and c["usable_cores"] < c.get("usable", 0):
        lines.append(f"hardware threads share cores: ranks past {c['usable_cores']} share a core "
                     f"with another rank")
    for n in c.get("numa") or []:
        lines.append(f"NUMA node {n['node']}: CPUs {n['cpus'] or 'none'}, {_size(n.get('memory_bytes'))}"
                     + ("" if n.get("memory_allowed") else " (memory not allowed to this process)"))
    return lines


def _memory(m: Facts) -> list[str]:
    thp, huge, shm = m.get("thp") or {}, m.get("hugetlb") or {}, m.get("shm") or {}
    pools = ", ".join(f"{_size(p['page_bytes'])} pages: {p['total']} ({p['free']} free)"
                      for p in huge.get("pools") or []) or "none"
    return [f"{_size(m.get('total_bytes'))} total, {_size(m.get('available_bytes'))} available",
            f"transparent huge pages: enabled={thp.get('enabled') or 'absent'}, "
            f"defrag={thp.get('defrag') or 'absent'}, "
            f"shmem_enabled={thp.get('shmem_enabled') or 'absent'}",
            f"hugetlb: {pools}",
            f"which pages of one array are huge (PAGEMAP_SCAN; each point's huge_share_ranks): "
            f"{_avail(m.get('page_scan') or {})}",
            f"{shm.get('path', '/dev/shm')}: {_shm(shm)}",
            ] + _copy_bandwidth(m.get("copy_bandwidth"))


def _shm(shm: Facts) -> str:
    """/dev/shm's size, free bytes and huge-page mode, or why it is unavailable."""
    if not shm.get("available"):
        return f"unavailable ({shm.get('reason')})"
    huge = f", huge pages: {shm['huge']}" if shm.get("huge") else ""
    return f"{_size(shm.get('size_bytes'))} ({_size(shm.get('free_bytes'))} free{huge})"


def _copy_bandwidth(bw: Optional[Facts]) -> list[str]:
    """Copy bandwidth by concurrent copies, each copy's share against one alone."""
    if not bw:
        return []
    if "error" in bw:
        return [f"copy bandwidth: unknown ({bw['error']})"]
    by = {int(k): v for k, v in bw["by_copiers"].items()}
    one = by.get(1) or 0
    cells = ", ".join(f"{k}: {v / 1e9:.1f}" + (f" ({v / k / one:.0%} each)" if one and k > 1 else "")
                      for k, v in sorted(by.items()))
    return [f"copy bandwidth by copies at once, GB/s of all together (each against one alone): {cells}; "
            f"{_size(bw.get('bytes_per_copier'))} each"]


def _mpi(m: Facts) -> list[str]:
    launcher = m.get("launcher") or {}
    where = (f"mpirun {launcher['path']} ({launcher['family']})" if launcher.get("available")
             else f"no launcher ({launcher.get('reason')})")
    if not m.get("available"):
        head = f"none usable: {m.get('reason')}; {where}"
    else:
        head = f"{m['library']} {m['version']} (mpi4py {m.get('mpi4py')}, {m.get('libmpi')}); {where}"
    aware = {True: "yes", False: "no"}.get(m.get("cuda_aware"), "unknown")
    return [head, f"CUDA-aware: {aware}; evidence:"] + [f"  - {e}" for e in m.get("evidence") or []]


def _software(g: Facts) -> list[str]:
    nccl, cupy = g.get("nccl") or {}, g.get("cupy")
    return [f"torch {g.get('torch') or 'absent'}, CUDA build {g.get('cuda') or 'none'}, "
            f"CUDA available: {'yes' if g.get('cuda_available') else 'no'}, driver {g.get('driver') or '-'}",
            "NCCL " + (f"{nccl['version']} ({nccl.get('source')})" if nccl.get("version")
                       else f"absent ({nccl.get('reason')})")
            + f", CuPy {cupy['version'] if cupy else 'absent'}"]


def _gpus(g: Facts) -> list[str]:
    shares = g.get("ranks_per_gpu") or []
    lines = []
    for i, d in enumerate(g.get("devices") or []):
        share = f", {shares[i]} of {g['ranks']} ranks" if i < len(shares) else ""
        lines.append(f"GPU {d['index']}: {d['name']}, {_size(d.get('memory_bytes'))}, "
                     f"bus {d.get('bus_id') or '?'}{share}")
    if not lines:
        ranks = f"; --ranks {g['ranks']}: no GPU to share" if g.get("ranks") else ""
        lines.append(f"none ({g.get('reason') or 'none found'}){ranks}")
    mps = g.get("mps") or {}
    lines.append(f"MPS: {'running' if mps.get('running') else 'not running'} "
                 f"(pipes {mps.get('pipe_dir')}; control {mps.get('control') or 'not installed'})")
    return lines


def _features(f: Facts) -> list[str]:
    slurm = f.get("slurm") or {}
    job = slurm.get("job")
    return [f"namespaces (--containers): {_avail(f.get('namespaces') or {})}",
            f"memkind high-bandwidth memory (--memory hbw): {_avail(f.get('memkind') or {})}",
            f"Slurm: {_avail(slurm)}" + (f", {slurm['version']}" if slurm.get("version") else "")
            + (f", in job {job.get('SLURM_JOB_ID')}" if job else ""),
            f"single copy between processes (CMA; Open MPI's large messages on one node): "
            f"{_avail(f.get('cma') or {})}"]


#: label -> (section key, its lines); the order of the output.
BLOCKS: tuple[tuple[str, str, Callable[[Facts], list[str]]], ...] = (
    ("cpus", "cpus", _cpus), ("memory", "memory", _memory), ("mpi", "mpi", _mpi),
    ("software", "gpus", _software), ("gpus", "gpus", _gpus), ("features", "features", _features),
)


def render_info(facts: Facts) -> str:
    """The text of ``ddlcomm info``: ``label  line`` blocks, then the GPU verdict."""
    out = [f"{'host':<10}{facts.get('host')} (probed in {facts.get('probe_s')} s)"]
    for label, key, lines in BLOCKS:
        section = facts.get(key) or {}
        body = [f"error: {section['error']}"] if "error" in section else lines(section)
        out.append(f"{label:<10}{body[0]}")
        out.extend(INDENT + line for line in body[1:])
    out.append(f"{'verdict':<10}{facts.get('gpu_verdict')}")
    return "\n".join(out)
