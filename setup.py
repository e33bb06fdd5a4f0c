"""Build of specdec_ext: one extension, specdec_ext._C, against the installed torch.

    pip install --no-build-isolation .        (or -e .)

CUDA kernels are built when torch is a CUDA build and nvcc is found (CUDA_HOME,
else the standard prefix). Environment:
    SPECDEC_FORCE_CUDA=1   a missing nvcc / CPU-only torch is an error
    SPECDEC_CPU_ONLY=1     skip the CUDA kernels
    TORCH_CUDA_ARCH_LIST   CUDA archs (default "9.0+PTX")
    MAX_JOBS               parallel compile jobs (ninja)
"""
import glob
import os
import sys

from setuptools import find_packages, setup


def _default_cuda_home():
    """CUDA_HOME, else the standard prefix when nvcc lives there. torch would
    otherwise guess from `which nvcc`, and a /usr/local/bin/nvcc wrapper makes
    it guess /usr/local (no lib64/libcudart there)."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    for prefix in ("/usr/local/cuda", "/opt/cuda"):
        if os.path.exists(os.path.join(prefix, "bin", "nvcc")):
            os.environ["CUDA_HOME"] = prefix
            return


_default_cuda_home()

import torch  # noqa: E402  (after CUDA_HOME is settled: cpp_extension reads it at import)
from torch.utils import cpp_extension  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))


def _flag(name):
    return os.environ.get(name, "0").lower() in ("1", "true", "yes", "on")


def _log(msg):
    print(f"[specdec_ext build] {msg}", file=sys.stderr, flush=True)


def _want_cuda():
    if _flag("SPECDEC_CPU_ONLY"):
        _log("SPECDEC_CPU_ONLY=1: building the CPU kernels only")
        return False
    problem = None
    if torch.version.cuda is None:
        problem = f"torch {torch.__version__} is not a CUDA build"
    elif cpp_extension.CUDA_HOME is None or not os.path.exists(
        os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    ):
        problem = "nvcc not found (set CUDA_HOME or install the CUDA toolkit)"
    if problem is None:
        return True
    if _flag("SPECDEC_FORCE_CUDA"):
        raise RuntimeError(f"SPECDEC_FORCE_CUDA=1 but {problem}")
    _log(f"{problem}: building the CPU kernels only (CPU-only build)")
    return False


def _cuda_include_dirs():
    """torch's CUDA headers include cuBLAS/cuSPARSE headers that a bare system
    CUDA may lack; torch's own nvidia pip packages ship them."""
    dirs = []
    for site in {os.path.dirname(os.path.dirname(torch.__file__))}:
        for sub in ("nvidia/cu13/include", "nvidia/cublas/include", "nvidia/cusparse/include"):
            d = os.path.join(site, sub)
            if os.path.isdir(d):
                dirs.append(d)
    return dirs


def extensions():
    with_cuda = _want_cuda()
    sources = ["csrc/ops.cpp", "csrc/sampling_args.cpp"] + sorted(glob.glob("csrc/cpu/*.cpp"))
    cxx = ["-O3", "-fvisibility=hidden", "-Wall", "-Wno-unknown-pragmas"]
    define = [("SPECDEC_WITH_CUDA", "1" if with_cuda else "0")]
    if not with_cuda:
        return [cpp_extension.CppExtension(
            "specdec_ext._C", sources, extra_compile_args={"cxx": cxx},
            define_macros=define, include_dirs=[os.path.join(ROOT, "csrc")])]
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0+PTX")
    _log(f"building with CUDA kernels: CUDA_HOME={cpp_extension.CUDA_HOME}, "
         f"TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}, "
         f"MAX_JOBS={os.environ.get('MAX_JOBS', 'default')}")
    sources += sorted(glob.glob("csrc/cuda/*.cpp")) + sorted(glob.glob("csrc/cuda/*.cu"))
    nvcc = ["-O3", "-lineinfo", "--expt-relaxed-constexpr"]
    return [cpp_extension.CUDAExtension(
        "specdec_ext._C", sources, extra_compile_args={"cxx": cxx, "nvcc": nvcc},
        define_macros=define,
        include_dirs=[os.path.join(ROOT, "csrc")] + _cuda_include_dirs())]


setup(
    name="specdec_ext",
    version="0.1.0",
    description="Fast, exact speculative decoding ops for PyTorch (CPU + CUDA)",
    packages=find_packages(include=["specdec_ext", "specdec_ext.*"]),
    package_data={"specdec_ext": ["assets/tiny_pair/checksums.json", "assets/tiny_pair/*/*.json",
                                  "assets/tiny_pair/*/*.safetensors"]},
    python_requires=">=3.10",
    install_requires=["torch>=2.11", "numpy", "prometheus_client", "safetensors", "tokenizers", "tqdm"],
    extras_require={"test": ["pytest", "hypothesis", "scipy", "transformers"], "hf": ["transformers"]},
    ext_modules=extensions(),
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
    zip_safe=False,
)
