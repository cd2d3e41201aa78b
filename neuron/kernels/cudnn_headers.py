"""Checking the hand-copied constants of the binding against the installed cuDNN headers:
compile a probe that prints every enum, macro and struct size/offset, and parse every prototype,
then compare with neuron.kernels.cudnn_api (the only way hand-copied constants stay honest)."""
from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import subprocess
import tempfile

from .cudnn_api import ENUMS, MACROS, SIGNATURES, STRUCT_LAYOUTS, site_dirs

# --------------------------------------------------------------------------------------------
# checking the hand-copied constants against the installed headers
# --------------------------------------------------------------------------------------------

_STUB_CUDA_HEADERS = {
    # cudnn_graph.h only needs these three names from the CUDA toolkit; none of them affects a
    # layout or value checked here, so stubs let the check run with just the cuDNN wheel.
    "cuda_runtime_api.h": "typedef struct CUstream_st *cudaStream_t;\n"
                          "typedef struct CUgraph_st *cudaGraph_t;\n",
    "library_types.h": "typedef enum libraryPropertyType_t { MAJOR_VERSION, MINOR_VERSION, "
                       "PATCH_LEVEL } libraryPropertyType;\n",
}


def find_include_dir(env=None, sites=None) -> str | None:
    """Directory holding cudnn.h: cuda.pathfinder, the wheel, $CUDNN_PATH, /usr/include."""
    env = os.environ if env is None else env
    try:
        from cuda import pathfinder
        d = pathfinder.find_nvidia_header_directory("cudnn")
        if d and os.path.exists(os.path.join(d, "cudnn.h")):
            return d
    except Exception:
        pass
    cands = [os.path.join(d, "nvidia", "cudnn", "include") for d in
             (site_dirs() if sites is None else sites)]
    if env.get("CUDNN_PATH"):
        cands.append(os.path.join(env["CUDNN_PATH"], "include"))
    cands += ["/usr/include", "/usr/local/cuda/include"]
    for d in cands:
        if os.path.exists(os.path.join(d, "cudnn_graph.h")):
            return d
    return None


def _cuda_include_dirs(env=None, sites=None) -> list[str]:
    env = os.environ if env is None else env
    cands = []
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if env.get(var):
            cands.append(os.path.join(env[var], "include"))
    cands.append("/usr/local/cuda/include")
    for d in (site_dirs() if sites is None else sites):
        cands += glob.glob(os.path.join(d, "nvidia", "cu1*", "include"))
        cands.append(os.path.join(d, "nvidia", "cuda_runtime", "include"))
    return [d for d in cands if os.path.exists(os.path.join(d, "cuda_runtime_api.h"))]


def probe_source() -> str:
    """C source printing, one per line, `name value` for every enum, macro and struct
    size/offset this module hard-codes."""
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "cudnn_graph.h"',
             '#include "cudnn_ops.h"', '#include "cudnn_cnn.h"', "int main(void) {"]
    for name in ENUMS:
        lines.append(f'  printf("{name} %d\\n", (int){name});')
    for name in MACROS:
        lines.append(f'  printf("{name} %.17g\\n", (double)({name}));')
    for cname, (_, _, fields) in STRUCT_LAYOUTS.items():
        lines.append(f'  printf("sizeof({cname}) %d\\n", (int)sizeof({cname}));')
        for f in fields:
            lines.append(f'  printf("offsetof({cname},{f}) %d\\n", (int)offsetof({cname}, {f}));')
    lines.append('  printf("sizeof(enum) %d\\n", (int)sizeof(cudnnDataType_t));')
    lines.append("  return 0;\n}")
    return "\n".join(lines) + "\n"


def expected_probe_values() -> dict[str, float]:
    """What probe_source() must print if this module is right."""
    exp: dict[str, float] = dict(ENUMS)
    exp.update(MACROS)
    for cname, (cls, size, fields) in STRUCT_LAYOUTS.items():
        exp[f"sizeof({cname})"] = size
        for f, off in fields.items():
            exp[f"offsetof({cname},{f})"] = off
    exp["sizeof(enum)"] = ctypes.sizeof(ctypes.c_int)
    return exp


_PARAM_RE = re.compile(r"\b(cudnn\w+)\s*\(([^;{]*?)\)\s*;", re.S)
_POINTER_TYPES = re.compile(r"(\*|\[\s*\]|cudnnHandle_t|Descriptor_t|cudaStream_t)")


def _param_code(param: str) -> str:
    p = re.sub(r"/\*.*?\*/", " ", param).strip()
    if _POINTER_TYPES.search(p):
        return "p"
    words = p.replace("const", " ").split()
    base = words[0] if words else ""
    if base == "double":
        return "d"
    if base == "size_t":
        return "z"
    if base == "int64_t":
        return "l"
    if base == "unsigned":
        return "u"
    return "i"          # int and every enum typedef


def parse_prototypes(header_text: str) -> dict[str, str]:
    """name -> signature code (see SIGNATURES) for every cudnn* prototype in the text."""
    text = re.sub(r"//[^\n]*", " ", header_text)
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    out = {}
    for m in _PARAM_RE.finditer(text):
        name, params = m.group(1), m.group(2).strip()
        if params in ("", "void"):
            out[name] = ""
        else:
            out[name] = "".join(_param_code(p) for p in params.split(","))
    return out


def check_headers(include_dir: str | None = None, cc: str | None = None) -> list[str]:
    """Compile a probe against the installed cuDNN headers and compare every hard-coded enum,
    macro, struct size/offset and function signature of this module with them.

    Returns a list of mismatches (empty = all agree). Raises FileNotFoundError when the headers
    or a C compiler are missing, RuntimeError when the probe does not compile."""
    include_dir = include_dir or find_include_dir()
    if include_dir is None:
        raise FileNotFoundError("cuDNN headers (cudnn_graph.h) not found")
    cc = cc or shutil.which("gcc") or shutil.which("cc") or shutil.which("g++")
    if cc is None:
        raise FileNotFoundError("no C compiler (gcc/cc/g++) on PATH")
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        inc = ["-I", include_dir]
        cuda_dirs = _cuda_include_dirs()
        if cuda_dirs:
            inc += ["-I", cuda_dirs[0]]
        else:
            for name, text in _STUB_CUDA_HEADERS.items():
                with open(os.path.join(tmp, name), "w") as f:
                    f.write(text)
            inc += ["-I", tmp]
        src = os.path.join(tmp, "probe.c")
        exe = os.path.join(tmp, "probe")
        with open(src, "w") as f:
            f.write(probe_source())
        lang = ["-x", "c"] if os.path.basename(cc).startswith(("g++", "c++", "clang++")) else []
        r = subprocess.run([cc, *lang, src, *inc, "-o", exe], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"probe did not compile with {cc}:\n{r.stderr[-4000:]}")
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    got = {}
    for line in out.splitlines():
        key, _, val = line.rpartition(" ")
        got[key] = float(val)
    for key, want in expected_probe_values().items():
        if key not in got:
            problems.append(f"{key}: not printed by the probe")
        elif got[key] != want:
            problems.append(f"{key}: header says {got[key]:g}, neuron has {want:g}")
    text = ""
    for h in ("cudnn_graph.h", "cudnn_ops.h", "cudnn_cnn.h"):
        with open(os.path.join(include_dir, h)) as f:
            text += f.read()
    protos = parse_prototypes(text)
    for name, sig in SIGNATURES.items():
        if name not in protos:
            problems.append(f"{name}: no prototype in the headers")
        elif protos[name] != sig:
            problems.append(f"{name}: header signature {protos[name]!r}, neuron declares {sig!r}")
    return problems
