include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(TARGETS eccl EXPORT ecclTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS eccl-run RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES include/eccl.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT ecclTargets NAMESPACE eccl:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/eccl)
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/ecclConfig.cmake.in
     "@PACKAGE_INIT@\ninclude(\"\${CMAKE_CURRENT_LIST_DIR}/ecclTargets.cmake\")\n")
configure_package_config_file(${CMAKE_CURRENT_BINARY_DIR}/ecclConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/ecclConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/eccl)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ecclConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ecclConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/ecclConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/eccl)
configure_file(cmake/eccl.pc.in ${CMAKE_CURRENT_BINARY_DIR}/eccl.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/eccl.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
