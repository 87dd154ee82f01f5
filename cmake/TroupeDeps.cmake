# Finds Troupe's dependencies and gathers them in the interface target tr_deps.
# Required: libuv, msgpack-c, jansson, OpenBLAS, oneDNN, libaio, pthreads, libm.
# Optional (AUTO|ON|OFF): MPI, the CUDA toolkit with cuBLAS, NCCL. For each optional part,
# TR_HAVE_<X> says whether it is built and TR_<X>_WHY says why not.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)

add_library(tr_deps INTERFACE)

function(tr_require_pkg var)
  pkg_check_modules(${var} IMPORTED_TARGET ${ARGN})
  if(NOT ${var}_FOUND)
    message(FATAL_ERROR "Troupe needs one of pkg-config modules '${ARGN}'. "
                        "Run scripts/install-deps.sh (or 'make deps') to install it.")
  endif()
  target_link_libraries(tr_deps INTERFACE PkgConfig::${var})
endfunction()

tr_require_pkg(UV libuv)
pkg_check_modules(MSGPACK IMPORTED_TARGET msgpack-c)
if(NOT MSGPACK_FOUND)
  tr_require_pkg(MSGPACK msgpack)
else()
  target_link_libraries(tr_deps INTERFACE PkgConfig::MSGPACK)
endif()
tr_require_pkg(JANSSON jansson)
tr_require_pkg(OPENBLAS openblas)
# oneDNN: the linear layers' matrix products (kernels/cpu/gemm.c)
find_package(dnnl CONFIG QUIET)
if(NOT dnnl_FOUND)
  message(FATAL_ERROR "Troupe needs oneDNN (Debian: libdnnl-dev). "
                      "Run scripts/install-deps.sh (or 'make deps') to install it.")
endif()
target_link_libraries(tr_deps INTERFACE DNNL::dnnl)

find_path(AIO_INCLUDE_DIR libaio.h)
find_library(AIO_LIBRARY aio)
if(NOT AIO_INCLUDE_DIR OR NOT AIO_LIBRARY)
  message(FATAL_ERROR "Troupe needs libaio (Debian: libaio-dev). Run scripts/install-deps.sh.")
endif()
target_include_directories(tr_deps INTERFACE ${AIO_INCLUDE_DIR})
target_link_libraries(tr_deps INTERFACE ${AIO_LIBRARY} Threads::Threads m dl)

# --- optional parts --------------------------------------------------------------------------
function(tr_optional name found why)
  if(${name} STREQUAL "OFF")
    set(TR_HAVE_${name} OFF PARENT_SCOPE)
    set(TR_${name}_WHY "disabled with -D${name}=OFF" PARENT_SCOPE)
  elseif(found)
    set(TR_HAVE_${name} ON PARENT_SCOPE)
    set(TR_${name}_WHY "" PARENT_SCOPE)
  elseif(${name} STREQUAL "ON")
    message(FATAL_ERROR "${name}=ON but ${why}")
  else()
    set(TR_HAVE_${name} OFF PARENT_SCOPE)
    set(TR_${name}_WHY "${why}" PARENT_SCOPE)
  endif()
endfunction()

# MPI
set(tr_mpi_found FALSE)
if(NOT TR_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C QUIET)
  set(tr_mpi_found ${MPI_C_FOUND})
endif()
tr_optional(TR_MPI "${tr_mpi_found}" "no MPI C library found (Debian: libopenmpi-dev)")
set(TR_HAVE_MPI ${TR_HAVE_TR_MPI})
if(TR_HAVE_MPI)
  target_link_libraries(tr_deps INTERFACE MPI::MPI_C)
endif()
set(TR_MPI_WHY ${TR_TR_MPI_WHY})

# CUDA toolkit + cuBLAS
set(tr_cuda_found FALSE)
if(NOT TR_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cublas)
    set(tr_cuda_found TRUE)
  endif()
endif()
tr_optional(TR_CUDA "${tr_cuda_found}" "no CUDA toolkit with cuBLAS found (looked in /usr/local/cuda)")
set(TR_HAVE_CUDA ${TR_HAVE_TR_CUDA})
set(TR_CUDA_WHY ${TR_TR_CUDA_WHY})

# NCCL (needs CUDA)
set(tr_nccl_found FALSE)
set(tr_nccl_why "NCCL needs the CUDA toolkit, which was not found")
if(TR_HAVE_CUDA AND NOT TR_NCCL STREQUAL "OFF")
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(tr_nccl_found TRUE)
  else()
    set(tr_nccl_why "nccl.h or libnccl not found next to the CUDA toolkit")
  endif()
endif()
tr_optional(TR_NCCL "${tr_nccl_found}" "${tr_nccl_why}")
set(TR_HAVE_NCCL ${TR_HAVE_TR_NCCL})
set(TR_NCCL_WHY ${TR_TR_NCCL_WHY})

# cmocka for the tests
if(TR_BUILD_TESTS)
  pkg_check_modules(CMOCKA IMPORTED_TARGET cmocka)
  if(NOT CMOCKA_FOUND)
    message(FATAL_ERROR "The tests need cmocka (Debian: libcmocka-dev), or -DTR_BUILD_TESTS=OFF.")
  endif()
endif()

# A generated header tells the sources which optional parts are built.
configure_file(${CMAKE_CURRENT_LIST_DIR}/tr_build_config.h.in
               ${PROJECT_BINARY_DIR}/generated/tr_build_config.h)
