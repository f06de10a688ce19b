# ONNX Runtime for the onnxruntime engine (src/cpp/engines/onnxruntime). Included by the top-level
# CMakeLists.txt after XpurtOptions.
#
#   XPURT_WITH_ONNXRUNTIME  AUTO (use it when found) / ON (fail when missing) / OFF
#   ONNXRUNTIME_ROOT        a folder with include/onnxruntime_cxx_api.h and lib/libonnxruntime.so; default
#                           <source>/.deps/onnxruntime, filled by scripts/fetch_onnxruntime.sh (ORT 1.29.0)
#
# Sets XPURT_ONNXRUNTIME_FOUND, XPURT_ONNXRUNTIME_REASON, XPURT_ONNXRUNTIME_INCLUDE_DIR,
# XPURT_ONNXRUNTIME_LIBRARY and XPURT_ONNXRUNTIME_LIBRARY_DIR (the folder the core's RPATH must name).
xpurt_dependency_option(XPURT_WITH_ONNXRUNTIME "ONNX Runtime (the onnxruntime engine behind InferenceSession)")
set(ONNXRUNTIME_ROOT "${PROJECT_SOURCE_DIR}/.deps/onnxruntime" CACHE PATH
    "ONNX Runtime folder (include/ and lib/); scripts/fetch_onnxruntime.sh fills the default one")

set(XPURT_ONNXRUNTIME_FOUND OFF)
set(XPURT_ONNXRUNTIME_INCLUDE_DIR "")
set(XPURT_ONNXRUNTIME_LIBRARY "")
set(XPURT_ONNXRUNTIME_LIBRARY_DIR "")
if(XPURT_WITH_ONNXRUNTIME STREQUAL "OFF")
  set(XPURT_ONNXRUNTIME_REASON "disabled by XPURT_WITH_ONNXRUNTIME=OFF")
else()
  # Only ONNXRUNTIME_ROOT is searched (NO_DEFAULT_PATH): a stray system copy of another version must not be
  # mixed with these headers. Plain variables rather than cache entries, so that a changed ONNXRUNTIME_ROOT or
  # a later fetch is picked up by the next configure.
  find_path(_xpurt_ort_include onnxruntime_cxx_api.h
            PATHS "${ONNXRUNTIME_ROOT}" PATH_SUFFIXES include include/onnxruntime NO_DEFAULT_PATH NO_CACHE)
  find_library(_xpurt_ort_library NAMES onnxruntime
               PATHS "${ONNXRUNTIME_ROOT}" PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH NO_CACHE)
  if(_xpurt_ort_include AND _xpurt_ort_library)
    set(XPURT_ONNXRUNTIME_FOUND ON)
    set(XPURT_ONNXRUNTIME_INCLUDE_DIR "${_xpurt_ort_include}")
    set(XPURT_ONNXRUNTIME_LIBRARY "${_xpurt_ort_library}")
    get_filename_component(XPURT_ONNXRUNTIME_LIBRARY_DIR "${_xpurt_ort_library}" DIRECTORY)
    set(_xpurt_ort_version "")
    if(EXISTS "${ONNXRUNTIME_ROOT}/.version")
      file(STRINGS "${ONNXRUNTIME_ROOT}/.version" _xpurt_ort_version LIMIT_COUNT 1)
    endif()
    set(XPURT_ONNXRUNTIME_REASON "${_xpurt_ort_version} ${XPURT_ONNXRUNTIME_LIBRARY}")
    string(STRIP "${XPURT_ONNXRUNTIME_REASON}" XPURT_ONNXRUNTIME_REASON)
  else()
    set(XPURT_ONNXRUNTIME_REASON
        "onnxruntime_cxx_api.h or libonnxruntime.so not found in ONNXRUNTIME_ROOT=${ONNXRUNTIME_ROOT} \
(run scripts/fetch_onnxruntime.sh, or set ONNXRUNTIME_ROOT to your ONNX Runtime)")
  endif()
  if(EXISTS "${ONNXRUNTIME_ROOT}/.version")
    set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${ONNXRUNTIME_ROOT}/.version")
  endif()
  xpurt_require_if_on(XPURT_WITH_ONNXRUNTIME XPURT_ONNXRUNTIME_FOUND "${XPURT_ONNXRUNTIME_REASON}")
endif()
