# Installs the library, its header, the launcher, the coordinator daemon and
# the perf programs; exports eccl::eccl (find_package(eccl)) and eccl.pc.
# Both are relocatable: `cmake --install build --prefix X` yields a working
# package under X.
include(CMakePackageConfigHelpers)
install(TARGETS eccl EXPORT ecclTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS eccl-run ecclcoord RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf
                sendrecv_perf reconfig_perf elastic_train
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# A sanitized build leaves these out (perf/CMakeLists.txt).
install(TARGETS dispatch_perf log_perf RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} OPTIONAL)
install(FILES include/eccl.h include/eccl_net.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT ecclTargets NAMESPACE eccl:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/eccl)
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/ecclConfig.cmake.in
     "@PACKAGE_INIT@\ninclude(\"\${CMAKE_CURRENT_LIST_DIR}/ecclTargets.cmake\")\n")
configure_package_config_file(${CMAKE_CURRENT_BINARY_DIR}/ecclConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/ecclConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/eccl)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ecclConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ecclConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/ecclConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/eccl)
# The .pc file finds the prefix from its own place (pkg-config's
# ${pcfiledir}), not from the prefix given at configure time.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(ECCL_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(ECCL_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(ECCL_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  string(REGEX REPLACE "[^/]+" ".." up "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
  set(ECCL_PC_PREFIX "\${pcfiledir}/${up}")
  set(ECCL_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(ECCL_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(cmake/eccl.pc.in ${CMAKE_CURRENT_BINARY_DIR}/eccl.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/eccl.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
