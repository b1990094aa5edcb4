# FindISAL: Intel's ISA-L (Debian: libisal-dev), for its hardware CRC32C (crc32_iscsi), which
# frames TensorBoard event records. Defines ISAL_FOUND and ISAL::isal.
find_path(ISAL_INCLUDE_DIR isa-l/crc.h HINTS $ENV{ISAL_ROOT} PATH_SUFFIXES include)
find_library(ISAL_LIBRARY isal HINTS $ENV{ISAL_ROOT} PATH_SUFFIXES lib lib64)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(ISAL REQUIRED_VARS ISAL_LIBRARY ISAL_INCLUDE_DIR)
if(ISAL_FOUND AND NOT TARGET ISAL::isal)
  add_library(ISAL::isal UNKNOWN IMPORTED)
  set_target_properties(ISAL::isal PROPERTIES IMPORTED_LOCATION "${ISAL_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${ISAL_INCLUDE_DIR}")
endif()
mark_as_advanced(ISAL_INCLUDE_DIR ISAL_LIBRARY)
