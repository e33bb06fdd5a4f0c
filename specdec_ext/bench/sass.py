"""python -m specdec_ext.bench sass: a static look at the built CUDA kernels (no GPU needed).

Reads the built library (specdec_ext/_C*.so) with cuobjdump (found next to torch's
Triton, triton/backends/nvidia/bin, else on PATH, else under CUDA_HOME/bin) and prints,
for every verify / sample / KV kernel instantiation:

* (kinds: verify, sample, filter = the filter cutoff pass, filtered = filtered_probs /
  mask_logits, coupled = coupled verify's race and decision kernels, kv)
* registers per thread, stack frame (bytes), spill stores / loads (STL / LDL in SASS),
  shared memory per block;
* theoretical blocks per SM at the kernel's block size (all our kernels launch 256
  threads), on this model of an H200 (compute 9.0): 65536 registers per SM, allocated
  per warp in units of 256 (regs/thread rounded up to 8); at most 2048 threads, 32
  blocks and 228 KB of shared memory per SM, 1 KB of which is reserved per block.
  The smallest of the four limits is printed (a model, not a measurement:
  cudaOccupancyMaxActiveBlocksPerMultiprocessor on the GPU is the authority);
* global loads by width in SASS: LDG ... .128 (16 bytes), .64 (8 bytes), and narrower
  (32 / 16 / 8-bit).

    python -m specdec_ext.bench sass [--lib PATH] [--arch sm_90] [--json PATH]

Exit 2 when the library has no device code (CPU-only build) or no cuobjdump is found.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys

from .._cli import OneLineParser, output_path

# The H200 model (see the module docstring).
REGS_PER_SM = 65536
REG_UNIT = 256          # registers are allocated per warp in units of 256
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED_PER_BLOCK = 1024
DEFAULT_BLOCK = 256     # kThreads in csrc/cuda/sampling_cuda.cu and kv_cache_cuda.cu
MODEL = ("H200 (sm_90): 65536 regs/SM in 256-register units per warp, 2048 threads/SM, "
         "32 blocks/SM, 228 KB smem/SM (+1 KB reserved per block)")


class NoDeviceCode(RuntimeError):
    pass


def find_cuobjdump():
    """cuobjdump next to torch's Triton, else on PATH, else under CUDA_HOME/bin; None if absent."""
    try:
        import triton  # noqa: F401
        d = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        if os.access(d, os.X_OK):
            return d
    except Exception:
        pass
    p = shutil.which("cuobjdump")
    if p:
        return p
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            p = os.path.join(os.environ[env], "bin", "cuobjdump")
            if os.access(p, os.X_OK):
                return p
    p = "/usr/local/cuda/bin/cuobjdump"
    return p if os.access(p, os.X_OK) else None


def find_library():
    """The built extension next to the specdec_ext package (without importing it)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    libs = sorted(glob.glob(os.path.join(here, "_C*.so")) + glob.glob(os.path.join(here, "_C*.pyd")))
    return libs[0] if libs else None


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=False).stdout
    lines = out.splitlines()
    return dict(zip(names, lines)) if len(lines) == len(names) else {n: n for n in names}


def _run(tool, args, lib):
    r = subprocess.run([tool, *args, lib], capture_output=True, text=True, check=False, timeout=300)
    text = r.stdout + r.stderr
    if "does not contain device code" in text:
        raise NoDeviceCode(f"{lib} has no device code (a CPU-only build)")
    if r.returncode != 0:
        raise RuntimeError(f"{os.path.basename(tool)} {' '.join(args)} failed: {text.strip()[:500]}")
    return r.stdout


def _function_lines(text, header):
    """(arch, function, line) for every line of a cuobjdump listing that belongs to a
    function; ``header`` matches the line that opens a function (group 1: its name)."""
    arch, fn = None, None
    for line in text.splitlines():
        m = re.match(r"\s*arch\s*=\s*(sm_\w+)", line)
        if m:
            arch, fn = m.group(1), None
            continue
        m = re.match(header, line)
        if m:
            fn = m.group(1)
            yield arch, fn, None  # the function starts
            continue
        if fn is not None:
            yield arch, fn, line


def parse_res_usage(text):
    """{(arch, mangled name): {reg, stack, shared, local}} from `cuobjdump -res-usage`."""
    out = {}
    for arch, fn, line in _function_lines(text, r"\s*Function\s+([^\s:]+)\s*:"):
        if line is not None and "REG:" in line and (arch, fn) not in out:
            vals = dict(re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", line))
            out[(arch, fn)] = dict(reg=int(vals.get("REG", 0)), stack=int(vals.get("STACK", 0)),
                                   shared=int(vals.get("SHARED", 0)), local=int(vals.get("LOCAL", 0)))
    return out


def ldg_width(opcode):
    """Bits of one global load from its SASS opcode (LDG.E.128, LDG.E.64, LDG.E.U16, LDG.E ...)."""
    parts = opcode.split(".")[1:]
    for p in parts:
        if p in ("128", "64"):
            return int(p)
    for p in parts:
        if p in ("U16", "S16"):
            return 16
        if p in ("U8", "S8"):
            return 8
    return 32


def parse_sass(text):
    """{(arch, mangled name): counters} from `cuobjdump -sass`."""
    out = {}
    for arch, fn, line in _function_lines(text, r"\s*Function\s*:\s*(\S+)"):
        if line is None:
            out[(arch, fn)] = dict(ldg128=0, ldg64=0, ldg_narrow=0, stl=0, ldl=0, instructions=0)
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if not m:
            continue
        op = m.group(1)
        c = out[(arch, fn)]
        c["instructions"] += 1
        if op.startswith("LDG.") or op == "LDG":
            w = ldg_width(op)
            c["ldg128" if w == 128 else "ldg64" if w == 64 else "ldg_narrow"] += 1
        elif op.startswith("STL"):
            c["stl"] += 1
        elif op.startswith("LDL"):
            c["ldl"] += 1
    return out


def blocks_per_sm(regs, shared, block=DEFAULT_BLOCK):
    """Theoretical resident blocks per SM on the H200 model, and which limit binds."""
    warps = (block + 31) // 32
    regs_per_warp = -(-max(regs, 1) * 32 // REG_UNIT) * REG_UNIT
    by_regs = (REGS_PER_SM // regs_per_warp) // warps
    by_threads = THREADS_PER_SM // (warps * 32)
    by_smem = SMEM_PER_SM // (shared + SMEM_RESERVED_PER_BLOCK)
    limits = dict(regs=by_regs, threads=by_threads, blocks=BLOCKS_PER_SM, smem=by_smem)
    n = min(limits.values())
    # the binding limit; on a tie the one that is not a register limit (regs are what we tune)
    order = ("threads", "blocks", "smem", "regs")
    return n, next(k for k in order if limits[k] == n)


def kind_of(name):
    if "verify_kernel" in name:
        return "verify"
    if "sample_kernel" in name:
        return "sample"
    if "filter_cutoff_kernel" in name:
        return "filter"  # the top-k / top-p / min-p cutoff pass (launched only with filters)
    if "filtered_kernel" in name:
        return "filtered"  # filtered_probs / mask_logits: sample's stats, then the outputs
    if "coupled_race_kernel" in name or "coupled_decide_kernel" in name:
        return "coupled"  # coupled verify: the per-position sample race and the decision
    if re.search(r"kv_|paged_", name):
        return "kv"
    return "other"


def short_name(name):
    """verify_kernel<float, __half> from the demangled signature."""
    s = name.replace("(anonymous namespace)::", "")
    s = re.sub(r"^void\s+", "", s)
    s = re.sub(r"\(.*\)$", "", s)
    s = s.replace("specdec::cuda::", "").replace("specdec::", "")
    return s.replace("__nv_bfloat16", "bf16").replace("__half", "half").replace("unsigned int", "u32")


def analyse(lib, tool, arch=None):
    res = parse_res_usage(_run(tool, ["-res-usage"], lib))
    sass = parse_sass(_run(tool, ["-sass"], lib))
    keys = sorted(set(res) | set(sass), key=lambda k: (k[0] or "", k[1]))
    if arch:
        keys = [k for k in keys if k[0] == arch]
    names = demangle(sorted({k[1] for k in keys}))
    rows = []
    for k in keys:
        full = names.get(k[1], k[1])
        kind = kind_of(full)
        if kind == "other" and "specdec" not in full:
            continue
        r = dict(arch=k[0], kind=kind, name=short_name(full), mangled=k[1], block=DEFAULT_BLOCK)
        r.update(res.get(k, dict(reg=None, stack=None, shared=None, local=None)))
        r.update(sass.get(k, dict(ldg128=None, ldg64=None, ldg_narrow=None, stl=None, ldl=None, instructions=None)))
        if r["reg"] is not None:
            r["blocks_per_sm"], r["limit"] = blocks_per_sm(r["reg"], r["shared"] or 0, r["block"])
        else:
            r["blocks_per_sm"], r["limit"] = None, None
        r["spills"] = (r["stl"] or 0) + (r["ldl"] or 0) > 0 or (r["local"] or 0) > 0
        rows.append(r)
    return rows


def print_table(rows):
    h = (f"{'arch':6} {'kind':7} {'kernel':58} {'reg':>4} {'stack':>5} {'STL':>4} {'LDL':>4} {'smem':>5} "
         f"{'blk/SM':>6} {'limit':>7} {'LDG128':>6} {'LDG64':>5} {'LDG<=32':>7}")
    print(h)
    for r in rows:
        print(f"{r['arch'] or '?':6} {r['kind']:7} {r['name'][:58]:58} {r['reg']!s:>4} {r['stack']!s:>5} "
              f"{r['stl']!s:>4} {r['ldl']!s:>4} {r['shared']!s:>5} {r['blocks_per_sm']!s:>6} {r['limit']!s:>7} "
              f"{r['ldg128']!s:>6} {r['ldg64']!s:>5} {r['ldg_narrow']!s:>7}")
    print(f"model: {MODEL}; block = {DEFAULT_BLOCK} threads")


def _existing_file(text: str) -> str:
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file")
    return text


def _arch(text: str) -> str:
    if not re.fullmatch(r"sm_\d+[af]?", text):
        raise argparse.ArgumentTypeError(f"expected a SASS arch such as sm_90, got {text!r}")
    return text


def main(argv):
    ap = OneLineParser(prog="python -m specdec_ext.bench sass", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", type=_existing_file,
                    help="the built library (default: specdec_ext/_C*.so next to this package)")
    ap.add_argument("--arch", type=_arch, default=None, help="only this SASS arch (e.g. sm_90); default: all")
    ap.add_argument("--json", metavar="PATH", type=output_path, help="write the rows as JSON")
    args = ap.parse_args(argv)
    lib = args.lib or find_library()
    if not lib:
        print("sass: no built specdec_ext/_C*.so found", file=sys.stderr)
        return 2
    tool = find_cuobjdump()
    if not tool:
        print("sass: no cuobjdump found (triton/backends/nvidia/bin, PATH, CUDA_HOME/bin)", file=sys.stderr)
        return 2
    try:
        rows = analyse(lib, tool, args.arch)
    except NoDeviceCode as e:
        print(f"sass: {e}", file=sys.stderr)
        return 2
    print(f"library {lib}\ncuobjdump {tool}")
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(library=lib, cuobjdump=tool, model=MODEL, rows=rows), f, indent=1)
    return 0
