"""python -m specdec_ext.info: how this specdec_ext was built and what it runs on.

    python -m specdec_ext.info

One line each: the package version and folder, the torch it runs on and the torch it was
built against, whether the CUDA kernels are built (and for which archs, with which nvcc)
and whether they cover the GPU present, which copy of the CPU kernels runs (AVX2 or the
default), and the compiler. Build facts come from ``specdec_ext/_build_info.py``, which
setup.py writes at every build; a build older than that record says so. In code,
``specdec_ext.has_cuda_kernels()`` answers the most common question.
"""
from __future__ import annotations

import os
import platform
import sys
from typing import Dict, List, Optional, Tuple

import torch

import specdec_ext

NOT_RECORDED = "not recorded (this build predates the build record; rebuild to record it)"
_AVX2_FLAGS = ("avx2", "fma", "f16c")


def build_info() -> Dict[str, object]:
    """The build record (``specdec_ext/_build_info.py``'s names), or {} when absent."""
    try:
        from . import _build_info
    except ImportError:
        return {}
    return {k: v for k, v in vars(_build_info).items() if k.isupper()}


def _cpu_flags() -> Optional[set]:
    """The CPU's feature flags from /proc/cpuinfo (Linux), or None where unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def cpu_kernel_variant(info: Dict[str, object], flags: Optional[set] = None,
                       env: Optional[Dict[str, str]] = None) -> Tuple[str, str]:
    """("AVX2" | "default", why): the copy of the CPU sampling kernels this process runs.

    Mirrors csrc/cpu/sampling_cpu.cpp's use_avx2(): the AVX2 copy runs when it was compiled
    (x86-64 builds), the CPU has AVX2, FMA and F16C, and SPECDEC_CPU_CAPABILITY is not
    "default". The extension does not export its choice, so this is inferred here from the
    same facts (the CPU flags from /proc/cpuinfo; elsewhere torch's own capability)."""
    env = os.environ if env is None else env
    machine = str(info.get("MACHINE") or platform.machine()).lower()
    if machine not in ("x86_64", "amd64"):
        return "default", f"built for {machine}: the AVX2 copy is x86-64 only"
    if env.get("SPECDEC_CPU_CAPABILITY") == "default":
        return "default", "SPECDEC_CPU_CAPABILITY=default"
    if flags is None:
        flags = _cpu_flags()
    if flags is not None:
        missing = [f for f in _AVX2_FLAGS if f not in flags]
        if missing:
            return "default", f"the CPU lacks {', '.join(missing).upper()}"
        return "AVX2", "the CPU has AVX2, FMA and F16C"
    capability = torch.backends.cpu.get_cpu_capability()  # torch's own pick: AVX2 / AVX512 imply AVX2 + FMA
    if capability in ("AVX2", "AVX512"):
        return "AVX2", f"torch reports CPU capability {capability}"
    return "default", f"torch reports CPU capability {capability}"


def _parse_archs(arch_list: str) -> List[Tuple[int, int, bool, bool]]:
    """TORCH_CUDA_ARCH_LIST ("8.0;9.0a;9.0+PTX", spaces or semicolons) ->
    [(major, minor, ptx, arch_specific)]. Unparseable entries (e.g. "Hopper") are skipped."""
    out = []
    for item in arch_list.replace(";", " ").split():
        ptx = item.upper().endswith("+PTX")
        num = item[:-4] if ptx else item
        specific = num[-1:].lower() in ("a", "f")
        try:
            major, minor = num.rstrip("aAfF").split(".")
            out.append((int(major), int(minor), ptx, specific))
        except ValueError:
            continue
    return out


def arch_coverage(arch_list: str, capability: Tuple[int, int]) -> str:
    """How a GPU of compute ``capability`` runs kernels built for ``arch_list``: natively
    (machine code of its major arch at or below its minor; an arch-specific "9.0a" only on
    that exact arch), by JIT from PTX (the first launches compile), or not at all."""
    major, minor = capability
    archs = _parse_archs(arch_list)
    if any(a == major and (b == minor if specific else b <= minor) for a, b, _, specific in archs):
        return "machine code for it is built"
    if any(ptx and (a, b) <= (major, minor) for a, b, ptx, _ in archs):
        return "runs by JIT from PTX (the first launches compile)"
    return "NOT covered: rebuild with its arch in TORCH_CUDA_ARCH_LIST"


def torch_lines(info: Dict[str, object]) -> List[str]:
    """The running torch and the one the build compiled against (with a warning on mismatch)."""
    running = f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})"
    lines = [f"torch running:        {running}"]
    built = info.get("TORCH_VERSION")
    if not built:
        return lines + [f"torch built against:  {NOT_RECORDED}"]
    lines.append(f"torch built against:  {built} (CUDA {info.get('TORCH_CUDA') or 'none'})")
    if built != torch.__version__:
        lines.append("WARNING: built against another torch: rebuild (pip install --no-build-isolation -e .)")
    return lines


def cuda_lines(info: Dict[str, object]) -> List[str]:
    """Whether the CUDA kernels are built, for which archs, and whether they cover the GPU."""
    if not specdec_ext.has_cuda_kernels():
        return ["CUDA kernels:         not built (CPU-only build: torch without CUDA, or no nvcc, "
                "or SPECDEC_CPU_ONLY=1)"]
    archs = info.get("CUDA_ARCH_LIST")
    nvcc = info.get("NVCC")
    lines = [f"CUDA kernels:         built, archs {archs or NOT_RECORDED}" + (f" ({nvcc})" if nvcc else "")]
    if not torch.cuda.is_available():
        return lines + ["GPU:                  none visible (the CUDA kernels are unused)"]
    for i in range(torch.cuda.device_count()):
        cap = torch.cuda.get_device_capability(i)
        cover = arch_coverage(archs, cap) if archs else "coverage unknown (archs not recorded)"
        lines.append(f"GPU {i}:                {torch.cuda.get_device_name(i)} (sm_{cap[0]}{cap[1]}): {cover}")
    return lines


def report() -> List[str]:
    """Every line ``python -m specdec_ext.info`` prints."""
    info = build_info()
    variant, why = cpu_kernel_variant(info)
    compiler = info.get("CXX_VERSION") or info.get("CXX") or NOT_RECORDED
    return ([f"specdec_ext {specdec_ext.__version__} in {os.path.dirname(os.path.abspath(specdec_ext.__file__))}",
             f"python:               {platform.python_version()} on {platform.machine()}"]
            + torch_lines(info) + cuda_lines(info)
            + [f"CPU kernels:          {variant} ({why})",
               f"compiler:             {compiler}"])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if argv:
        print(f"python -m specdec_ext.info: error: takes no arguments, got {' '.join(argv)!r} (see --help)",
              file=sys.stderr)
        return 2
    print("\n".join(report()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
