#!/usr/bin/env python3
"""Checks the site recipes in packaging/ against the build they describe (ctest
packaging_recipes): no Spack, Apptainer or Lmod is installed here, so each is checked as far
as this machine allows.

- Spack: package.py is loaded with a stand-in for `spack.package` that records the directives;
  every variant named in cmake_args exists, cmake_args runs for a CPU and a CUDA spec, the CUDA
  architectures come out as SASS for each and PTX for the newest, and every -D it passes is a
  cache variable of the build.
- Apptainer: the header (Bootstrap, From), known sections only, and every -D of its cmake line
  is a cache variable of the build.
- Lmod: `luac -p` (Debian's lua5.4) when present, else a visible skip of that part; the paths
  it prepends are the install layout's.
Usage: check_recipes.py REPO_ROOT
"""
import importlib.util
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

root = Path(sys.argv[1])
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


# The cache variables live in the root CMakeLists.txt and the modules it includes (cmake/*.cmake:
# DltrainOptions.cmake holds the options).
cmake_text = "\n".join(
    f.read_text() for f in [root / "CMakeLists.txt", *sorted((root / "cmake").glob("*.cmake"))])
cache_vars = set(re.findall(r"option\((DLTRAIN_\w+)", cmake_text))
cache_vars |= set(re.findall(r"set\((DLTRAIN_\w+)\s[^)]*CACHE", cmake_text))
check("DLTRAIN_CUDA_ARCHITECTURES" in cache_vars, "the build lost DLTRAIN_CUDA_ARCHITECTURES")

# --- Spack ------------------------------------------------------------------------------------
directives = {"variant": [], "depends_on": [], "conflicts": [], "version": []}


def recorder(kind):
    def f(*args, **kwargs):
        directives[kind].append((args, kwargs))
    return f


class Variant:
    def __init__(self, value):
        self.value = value


class Spec:
    def __init__(self, flags, cuda_arch=()):
        self.flags = set(flags)
        self.variants = {"cuda_arch": Variant(tuple(cuda_arch) or ("none",))}

    def satisfies(self, s):
        return s in self.flags

    def __getitem__(self, name):
        return types.SimpleNamespace(prefix=f"/spack/opt/{name}")


class CMakePackage:
    run_tests = False

    def define(self, name, value):
        if isinstance(value, (list, tuple)):
            value = ";".join(value)
        if isinstance(value, bool):
            value = "ON" if value else "OFF"
        return f"-D{name}={value}"

    def define_from_variant(self, name, variant):
        declared = {a[0] for a, _ in directives["variant"]}
        check(variant in declared, f"spack: define_from_variant uses undeclared variant '{variant}'")
        on = f"+{variant}" in self.spec.flags
        return f"-D{name}={'ON' if on else 'OFF'}"


class CudaPackage:
    pass


stub = types.ModuleType("spack.package")
for kind in directives:
    setattr(stub, kind, recorder(kind))
stub.license = lambda *a, **k: None
stub.CMakePackage, stub.CudaPackage = CMakePackage, CudaPackage
stub.working_dir = lambda *a, **k: None
stub.ctest = lambda *a, **k: None
stub.__all__ = [n for n in dir(stub) if not n.startswith("_")]
sys.modules["spack"] = types.ModuleType("spack")
sys.modules["spack.package"] = stub
spec_file = root / "packaging/spack/dltrain/package.py"
mod_spec = importlib.util.spec_from_file_location("dltrain_package", spec_file)
mod = importlib.util.module_from_spec(mod_spec)
mod_spec.loader.exec_module(mod)
pkg_cls = mod.Dltrain
check(pkg_cls.__doc__ and len(pkg_cls.__doc__) > 40, "spack: the class needs a docstring")
check(directives["version"], "spack: no version()")
for flags, archs, want in [
    ({"+mpi", "+hdf5", "+jpeg", "+dnnl", "+tensorboard", "+examples"}, (), None),
    ({"+cuda", "+mpi", "+hdf5"}, ("80", "90", "70"), "70-real;80-real;90"),
]:
    p = pkg_cls()
    p.spec = Spec(flags, archs)
    args = p.cmake_args()
    for a in args:
        name = a[2:].split("=", 1)[0]
        check(name in cache_vars, f"spack: -D{name} is not a cache variable of the build")
    got = [a.split("=", 1)[1] for a in args if a.startswith("-DDLTRAIN_CUDA_ARCHITECTURES=")]
    check((got[0] if got else None) == want, f"spack: CUDA architectures {got} for {archs}, want {want}")
    check(f"-DDLTRAIN_CUDA={'ON' if '+cuda' in flags else 'OFF'}" in args, "spack: DLTRAIN_CUDA")

# --- Apptainer -------------------------------------------------------------------------------
deff = (root / "packaging/apptainer/dltrain.def").read_text()
header = [l for l in deff.splitlines() if l.strip() and not l.startswith("#")][:2]
check(header and header[0].startswith("Bootstrap: docker"), "apptainer: first line must be Bootstrap")
check(len(header) > 1 and re.match(r"From: nvidia/cuda:\S+-cudnn-devel-", header[1]),
      "apptainer: From must be an NVIDIA CUDA cudnn-devel image")
known = {"%labels", "%help", "%files", "%post", "%environment", "%runscript", "%test", "%setup"}
for sec in re.findall(r"^(%\w+)", deff, re.M):
    check(sec in known, f"apptainer: unknown section {sec}")
for name in re.findall(r"-D(DLTRAIN_\w+)=", deff):
    check(name in cache_vars, f"apptainer: -D{name} is not a cache variable of the build")

# --- Lmod ------------------------------------------------------------------------------------
lua = root / "packaging/lmod/dltrain.lua"
luac = shutil.which("luac5.4") or shutil.which("luac5.3") or shutil.which("luac")
if luac:
    r = subprocess.run([luac, "-p", str(lua)], capture_output=True, text=True)
    check(r.returncode == 0, f"lmod: {luac} -p: {r.stderr.strip()}")
else:
    print("check_recipes: SKIPPED the Lua syntax check of the Lmod file (no luac; apt-get install lua5.4)")
lua_text = lua.read_text()
for var, sub in [("CMAKE_PREFIX_PATH", "root"), ("PKG_CONFIG_PATH", '"lib", "pkgconfig"'),
                 ("PATH", '"bin"')]:
    check(re.search(rf'prepend_path\("{var}",[^\n]*{re.escape(sub)}', lua_text),
          f"lmod: {var} must point into the install prefix")

if failures:
    print("\n".join("check_recipes: FAIL " + f for f in failures))
    sys.exit(1)
print(f"check_recipes: spack ({len(directives['variant'])} variants, "
      f"{len(directives['depends_on'])} dependencies), apptainer and lmod recipes OK")
