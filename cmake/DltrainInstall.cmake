# Installing dltrain (included by the root CMakeLists.txt after the library target): the
# library, its headers, the oneDNN runtime when it is private to the checkout, the CMake
# package (find_package(dltrain)) and dltrain.pc for pkg-config.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(TARGETS dltrain EXPORT dltrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/dltrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The oneDNN runtime beside libdltrain: the file itself and its SONAME link (PyPI's wheel has
# copies, not links: one copy is installed, not three). No libdnnl.so development link, so a
# -ldnnl of other software never picks up this oneDNN from a prefix such as /usr/local.
set(DLTRAIN_DNNL_INSTALLED_LIBRARY "")
if(DLTRAIN_DNNL_BUNDLED)
  install(FILES "${_dltrain_dnnl_file}" DESTINATION ${CMAKE_INSTALL_LIBDIR}
          PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                      WORLD_READ WORLD_EXECUTE)
  if(NOT _dltrain_dnnl_soname STREQUAL _dltrain_dnnl_file_name)
    file(MAKE_DIRECTORY ${PROJECT_BINARY_DIR}/dnnl-runtime)
    file(CREATE_LINK "${_dltrain_dnnl_file_name}"
         "${PROJECT_BINARY_DIR}/dnnl-runtime/${_dltrain_dnnl_soname}" SYMBOLIC)
    install(FILES "${PROJECT_BINARY_DIR}/dnnl-runtime/${_dltrain_dnnl_soname}"
            DESTINATION ${CMAKE_INSTALL_LIBDIR})
  endif()
  set(DLTRAIN_DNNL_INSTALLED_LIBRARY "${CMAKE_INSTALL_LIBDIR}/${_dltrain_dnnl_soname}")
endif()
install(EXPORT dltrainTargets NAMESPACE dltrain:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dltrain)
configure_package_config_file(cmake/dltrainConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dltrainConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dltrain
  PATH_VARS DLTRAIN_DNNL_INSTALLED_LIBRARY)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dltrainConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
# dltrain.pc for pkg-config users: dependencies that ship a .pc file by name (Requires),
# the others (oneDNN, CUDA, cuDNN, NCCL) as -L/-l flags from where they were found.
find_package(PkgConfig QUIET)
set(DLTRAIN_PC_REQUIRES "")
set(DLTRAIN_PC_LIBS "")
set(DLTRAIN_PC_CFLAGS "")
function(dltrain_pc_dep)  # dltrain_pc_dep(<library file> <pkg-config name>...)
  set(lib ${ARGV0})
  list(REMOVE_AT ARGV 0)
  foreach(name IN LISTS ARGV)
    if(PKG_CONFIG_FOUND)
      execute_process(COMMAND ${PKG_CONFIG_EXECUTABLE} --exists ${name} RESULT_VARIABLE rc)
      if(rc EQUAL 0)
        set(DLTRAIN_PC_REQUIRES "${DLTRAIN_PC_REQUIRES} ${name}" PARENT_SCOPE)
        return()
      endif()
    endif()
  endforeach()
  if(lib)
    get_filename_component(dir "${lib}" DIRECTORY)
    get_filename_component(name "${lib}" NAME_WE)
    string(REGEX REPLACE "^lib" "" name "${name}")
    set(DLTRAIN_PC_LIBS "${DLTRAIN_PC_LIBS} -L${dir} -l${name}" PARENT_SCOPE)
  endif()
endfunction()
if(DLTRAIN_WITH_HDF5)
  dltrain_pc_dep("${DltrainHDF5_LIBRARY}" hdf5 hdf5-serial)
endif()
if(DLTRAIN_WITH_MPI)
  dltrain_pc_dep("${DltrainMPI_LIBRARY}" ompi-c mpich mpi-c)
endif()
if(DLTRAIN_WITH_JPEG)
  dltrain_pc_dep("" libturbojpeg)
endif()
if(DLTRAIN_WITH_LIBJPEG)
  dltrain_pc_dep("" libjpeg)
endif()
if(DLTRAIN_WITH_ZLIB)
  dltrain_pc_dep("" zlib)
endif()
if(DLTRAIN_WITH_PROTOBUF)
  dltrain_pc_dep("" protobuf-lite)
  dltrain_pc_dep("" libisal)
endif()
if(DLTRAIN_WITH_PNG)
  dltrain_pc_dep("" libpng)
endif()
if(DLTRAIN_WITH_DNNL AND DLTRAIN_DNNL_BUNDLED)
  # By its path in the prefix (no libdnnl.so link is installed; the program records the SONAME).
  set(DLTRAIN_PC_LIBS "${DLTRAIN_PC_LIBS} \${libdir}/${_dltrain_dnnl_soname} -lgomp")
elseif(DLTRAIN_WITH_DNNL)
  get_target_property(_dnnl_lib DNNL::dnnl LOCATION)
  dltrain_pc_dep("${_dnnl_lib}")
  set(DLTRAIN_PC_LIBS "${DLTRAIN_PC_LIBS} -lgomp")
endif()
if(DLTRAIN_WITH_CUDA)
  set(DLTRAIN_PC_CFLAGS "-DDLTRAIN_WITH_CUDA=1")
  if(DLTRAIN_CUDART STREQUAL "CUDA::cudart_static")
    set(_dltrain_pc_cudart "-lcudart_static -ldl -lrt")
  else()
    set(_dltrain_pc_cudart "-lcudart")
  endif()
  set(DLTRAIN_PC_LIBS "${DLTRAIN_PC_LIBS} -L${CUDAToolkit_LIBRARY_DIR} ${_dltrain_pc_cudart} -lcublasLt -lcublas")
  dltrain_pc_dep("${CUDNN_LIBRARY}")
  if(DLTRAIN_WITH_NCCL)
    dltrain_pc_dep("${NCCL_LIBRARY}")
  endif()
endif()
string(STRIP "${DLTRAIN_PC_REQUIRES}" DLTRAIN_PC_REQUIRES)
string(STRIP "${DLTRAIN_PC_LIBS}" DLTRAIN_PC_LIBS)
# A shared libdltrain.so carries its dependencies itself (DT_NEEDED, RUNPATH): they move to
# the .private fields, which only `pkg-config --static` adds to the link line.
set(DLTRAIN_PC_REQUIRES_PRIVATE "")
set(DLTRAIN_PC_LIBS_PRIVATE "")
set(DLTRAIN_PC_KIND "a static library: its dependencies are on the link line")
if(DLTRAIN_SHARED)
  set(DLTRAIN_PC_REQUIRES_PRIVATE "${DLTRAIN_PC_REQUIRES}")
  set(DLTRAIN_PC_LIBS_PRIVATE "${DLTRAIN_PC_LIBS}")
  set(DLTRAIN_PC_REQUIRES "")
  set(DLTRAIN_PC_LIBS "")
  set(DLTRAIN_PC_KIND "a shared library: its dependencies are in Requires.private/Libs.private")
endif()
configure_file(cmake/dltrain.pc.in ${PROJECT_BINARY_DIR}/dltrain.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/dltrain.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
install(FILES ${PROJECT_BINARY_DIR}/dltrainConfig.cmake
              ${PROJECT_BINARY_DIR}/dltrainConfigVersion.cmake
              cmake/FindCUDNN.cmake cmake/FindNCCL.cmake cmake/FindTurboJPEG.cmake cmake/FindISAL.cmake
              cmake/FindDltrainHDF5.cmake cmake/FindDltrainMPI.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dltrain)

