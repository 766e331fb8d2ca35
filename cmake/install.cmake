# Installation: idist-run, libidist and its headers, libidist-launch (idist::spawn), a CMake
# package (find_package(idist CONFIG) -> idist::idist, idist::launch), a pkg-config file, and the idist-run man page.
# The backend plugins install themselves (lib/CMakeLists.txt, idist_backend_plugin). Each file
# belongs to a component, which cmake/package.cmake turns into a Debian package:
#   runtime  libidist.so.0, libidist-launch.so.0, idist-run, its man page   -> idist
#   dev      headers, the .so links, the CMake package, the pkg-config files  -> idist-dev
#   backend-NAME  <libdir>/idist/libidist-backend-NAME.so                    -> idist-backend-NAME
#   torch, torch-dev  libidist-torch.so.0; its header, .so link, CMake targets, pkg-config
#                 (torch/CMakeLists.txt, where libtorch was found)            -> idist-torch
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(IDIST_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/idist)

install(TARGETS idist idist_launch EXPORT idistTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/lib/include/idist ${PROJECT_SOURCE_DIR}/launch/include/idist
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev FILES_MATCHING PATTERN "*.hpp"
  PATTERN env_contract.hpp EXCLUDE)  # shared by idist-run and libidist, not part of the API
install(EXPORT idistTargets NAMESPACE idist:: DESTINATION ${IDIST_CMAKE_DIR} COMPONENT dev)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/idistConfig.cmake.in
  ${PROJECT_BINARY_DIR}/idistConfig.cmake
  INSTALL_DESTINATION ${IDIST_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/idistConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)  # 0.x: minor versions may break the API
install(FILES ${PROJECT_BINARY_DIR}/idistConfig.cmake ${PROJECT_BINARY_DIR}/idistConfigVersion.cmake
  DESTINATION ${IDIST_CMAKE_DIR} COMPONENT dev)

file(RELATIVE_PATH IDIST_PC_TO_PREFIX "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" IDIST_PC_TO_PREFIX "${IDIST_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/idist.pc.in ${PROJECT_BINARY_DIR}/idist.pc @ONLY)
configure_file(${PROJECT_SOURCE_DIR}/cmake/idist-launch.pc.in ${PROJECT_BINARY_DIR}/idist-launch.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/idist.pc ${PROJECT_BINARY_DIR}/idist-launch.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
if(TARGET idist_torch)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/idist-torch.pc.in ${PROJECT_BINARY_DIR}/idist-torch.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/idist-torch.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT torch-dev)
endif()

# idist-run does no collectives; it links libidist for idist::plugin_status alone (--version,
# --dry-run), and finds it by its RPATH, $ORIGIN/../<libdir> (apps/idist-run/CMakeLists.txt).
install(TARGETS idist-run RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)

# The man page is idist-run --help, formatted by help2man, so the two never disagree.
find_program(HELP2MAN help2man)
if(HELP2MAN)
  add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/idist-run.1
    # The version alone: --version's other lines name the plugins installed where it runs,
    # which a page made at build time cannot know.
    COMMAND ${HELP2MAN} --no-info --section=1 --version-string=${PROJECT_VERSION}
            "--name=run a program as a distributed job (gloo, nccl, mpi)"
            --output=${PROJECT_BINARY_DIR}/idist-run.1 $<TARGET_FILE:idist-run>
    DEPENDS idist-run VERBATIM)
  add_custom_target(idist-run-man ALL DEPENDS ${PROJECT_BINARY_DIR}/idist-run.1)
  install(FILES ${PROJECT_BINARY_DIR}/idist-run.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT runtime)
else()
  message(STATUS "idist: help2man not found; the idist-run man page is not built")
endif()
