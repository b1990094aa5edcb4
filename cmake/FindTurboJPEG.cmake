# FindTurboJPEG: libjpeg-turbo's TurboJPEG API (Debian: libturbojpeg0-dev).
# Defines TurboJPEG_FOUND and TurboJPEG::turbojpeg.
find_path(TurboJPEG_INCLUDE_DIR turbojpeg.h HINTS $ENV{TURBOJPEG_ROOT} PATH_SUFFIXES include)
find_library(TurboJPEG_LIBRARY turbojpeg HINTS $ENV{TURBOJPEG_ROOT} PATH_SUFFIXES lib lib64)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(TurboJPEG REQUIRED_VARS TurboJPEG_LIBRARY TurboJPEG_INCLUDE_DIR)
if(TurboJPEG_FOUND AND NOT TARGET TurboJPEG::turbojpeg)
  add_library(TurboJPEG::turbojpeg UNKNOWN IMPORTED)
  set_target_properties(TurboJPEG::turbojpeg PROPERTIES IMPORTED_LOCATION "${TurboJPEG_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${TurboJPEG_INCLUDE_DIR}")
endif()
mark_as_advanced(TurboJPEG_INCLUDE_DIR TurboJPEG_LIBRARY)
