-- Lmod modulefile template for dltrain. Install as <modulepath>/dltrain/0.1.0.lua and set
-- `root` to the prefix given to `cmake --install build --prefix ...`. The dependencies the
-- site's build was made with must be loaded too: uncomment and name the site's modules.
help([[
dltrain 0.1.0: C++ deep-learning training library (CUDA/cuDNN, oneDNN, MPI/NCCL, HDF5).
Build a program against it with CMake (find_package(dltrain) finds it through
CMAKE_PREFIX_PATH) or pkg-config (pkg-config --cflags --libs dltrain); run the examples
(dltrain-resnet50, ...) with srun, one task per GPU: see examples/resnet50/slurm/.
]])
whatis("Name: dltrain")
whatis("Version: 0.1.0")
whatis("Category: library, machine learning")
whatis("Description: C++ deep-learning training library")

local root = "/opt/dltrain/0.1.0"

-- depends_on("cuda/12.6", "cudnn/9", "nccl/2", "openmpi/4.1", "hdf5/1.14")

prepend_path("PATH", pathJoin(root, "bin"))
prepend_path("CMAKE_PREFIX_PATH", root)
prepend_path("PKG_CONFIG_PATH", pathJoin(root, "lib", "pkgconfig"))
prepend_path("CPATH", pathJoin(root, "include"))
prepend_path("LIBRARY_PATH", pathJoin(root, "lib"))
-- Programs built with pkg-config find libdltrain.so (DLTRAIN_SHARED) and the oneDNN runtime
-- installed beside it (libdnnl.so.3) here; dltrain's own programs and CMake-built programs
-- find them through their run paths without it.
prepend_path("LD_LIBRARY_PATH", pathJoin(root, "lib"))
setenv("DLTRAIN_ROOT", root)
