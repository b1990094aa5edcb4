# Spack recipe for dltrain. Use it from a repository of your own:
#   spack repo create myrepo && cp -r packaging/spack/dltrain myrepo/packages/
#   spack repo add myrepo && spack install dltrain +cuda cuda_arch=90 ^openmpi
# Spack's compiler wrappers already pass the target's -march (archspec), so the recipe keeps
# DLTRAIN_NATIVE off: the build is tuned for the `target=` of the spec, not the login node.
from spack.package import *


class Dltrain(CMakePackage, CudaPackage):
    """C++20 deep-learning training library: a tensor/autograd core with cuDNN (GPU) and
    oneDNN (CPU) layers, mixed precision with loss scaling, channels-last, MPI/NCCL data
    parallelism that overlaps gradient reduction with backward, a multithreaded data loader
    and HDF5 checkpoints."""

    homepage = "https://github.com/dltrain/dltrain"
    git = "https://github.com/dltrain/dltrain.git"

    license("Apache-2.0")

    version("main", branch="main")

    variant("mpi", default=True, description="MPI process groups (data parallelism on CPU ranks)")
    variant("hdf5", default=True, description="HDF5 checkpoints and packed datasets")
    variant("jpeg", default=True, description="JPEG decoding (ImageFolder) with libjpeg-turbo")
    variant("dnnl", default=True, description="oneDNN CPU convolution, batch norm and pooling")
    variant("tensorboard", default=True, description="TensorBoard event files (protobuf, ISA-L)")
    variant("examples", default=True, description="Build and install the bundled examples")
    variant("shared", default=False, description="Build libdltrain.so instead of libdltrain.a")

    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("cmake@3.25:", type="build")
    depends_on("pkgconfig", type="build")
    depends_on("eigen@3.3:")
    depends_on("nlohmann-json@3.2:", type="build")
    depends_on("catch2@2", type="test")
    depends_on("zlib-api")
    depends_on("libpng")
    depends_on("mpi", when="+mpi")
    depends_on("hdf5@1.10: ~mpi", when="+hdf5")
    depends_on("libjpeg-turbo", when="+jpeg")
    # dltrain shares oneDNN's OpenMP thread team: an OpenMP build of oneDNN.
    depends_on("onednn@2.6: cpu_runtime=omp", when="+dnnl")
    depends_on("protobuf", when="+tensorboard")
    depends_on("isa-l", when="+tensorboard")
    depends_on("cudnn@9:", when="+cuda")
    depends_on("nccl", when="+cuda")

    # The kernels use C++20 and CUDA 12's cooperative features; Volta (sm_70) is the oldest GPU.
    conflicts("%gcc@:10", msg="dltrain needs C++20 (GCC 11 or newer)")
    for _arch in ("50", "52", "53", "60", "61", "62"):
        conflicts(f"cuda_arch={_arch}", when="+cuda", msg="dltrain supports sm_70 and newer")
    conflicts("^cuda@:11", when="+cuda", msg="dltrain needs CUDA 12 or newer")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define("DLTRAIN_NATIVE", False),
            self.define("DLTRAIN_CUDA", "ON" if spec.satisfies("+cuda") else "OFF"),
            self.define("DLTRAIN_DNNL", "ON" if spec.satisfies("+dnnl") else "OFF"),
            self.define_from_variant("DLTRAIN_MPI", "mpi"),
            self.define_from_variant("DLTRAIN_HDF5", "hdf5"),
            self.define_from_variant("DLTRAIN_JPEG", "jpeg"),
            self.define_from_variant("DLTRAIN_PROTOBUF", "tensorboard"),
            self.define_from_variant("DLTRAIN_BUILD_EXAMPLES", "examples"),
            self.define_from_variant("DLTRAIN_SHARED", "shared"),
            self.define("DLTRAIN_BUILD_TESTS", self.run_tests),
            self.define("DLTRAIN_BUILD_BENCHMARKS", False),
            self.define("DLTRAIN_BUILD_TOOLS", True),
        ]
        if spec.satisfies("+dnnl"):
            args.append(self.define("DLTRAIN_DNNL_ROOT", spec["onednn"].prefix))
            # Spack's onednn stays a dependency, reached through Spack's RPATHs: no copy of
            # libdnnl.so in dltrain's prefix (AUTO would not copy it either; said for clarity).
            args.append(self.define("DLTRAIN_INSTALL_DNNL", "OFF"))
        if spec.satisfies("+cuda"):
            archs = sorted((a for a in spec.variants["cuda_arch"].value if a != "none"), key=int)
            if archs:
                # SASS for each, PTX for the newest (forward compatibility).
                args.append(
                    self.define(
                        "DLTRAIN_CUDA_ARCHITECTURES", [f"{a}-real" for a in archs[:-1]] + archs[-1:]
                    )
                )
        return args

    def check(self):
        with working_dir(self.build_directory):
            ctest("--output-on-failure", "-LE", "mpi|fuzz")
