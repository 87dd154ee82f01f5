# Installs libtroupe, the public headers, the troupe::troupe CMake package and troupe.pc.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS troupe EXPORT troupeTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS troupe_static ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT troupeTargets NAMESPACE troupe::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/troupeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/troupeConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/troupeConfig.cmake ${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
set(TR_PC_REQUIRES_PRIVATE "libuv jansson openblas ${MSGPACK_MODULE_NAME}")
# A static link needs the MPI library too when the MPI comm backend is built: its libraries as
# CMake found them (full paths; Open MPI's and MPICH's .pc names differ, so no Requires).
set(TR_PC_LIBS_PRIVATE_MPI "")
if(TR_HAVE_MPI)
  foreach(lib IN LISTS MPI_C_LIBRARIES)
    string(APPEND TR_PC_LIBS_PRIVATE_MPI " ${lib}")
  endforeach()
endif()
file(RELATIVE_PATH TR_PC_UP "/x/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/x") # relocatable .pc
configure_file(${CMAKE_CURRENT_LIST_DIR}/troupe.pc.in ${PROJECT_BINARY_DIR}/troupe.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/troupe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
