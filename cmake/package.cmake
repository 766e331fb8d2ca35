# Debian packages from the install components (cmake/install.cmake): `cpack -G DEB` in the
# build directory writes idist_<version>_<arch>.deb (runtime + launcher), idist-dev (headers,
# CMake package, pkg-config) and one idist-backend-NAME per plugin built. Files go under /usr,
# where a consumer's compiler, pkg-config and find_package look without being told. Configure
# with -DCMAKE_INSTALL_PREFIX=/usr for Debian's multiarch libdir (lib/x86_64-linux-gnu);
# otherwise the libraries go to /usr/lib, which works as well.
# dpkg-shlibdeps (dpkg-dev) computes the Depends on Debian's libraries (libgloo0, libopenmpi3...);
# the packages' Depends on one another pin the exact version, since plugins and libidist must match.

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME idist)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR idist)
set(CPACK_PACKAGE_CONTACT "idist developers <idist@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Run programs as distributed jobs (idist-run) with collectives over gloo, mpi and nccl")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES OFF)  # keep RelWithDebInfo's symbols: stack traces from users' jobs stay readable

set(CPACK_DEB_COMPONENT_INSTALL ON)
get_property(idist_plugins GLOBAL PROPERTY IDIST_PLUGINS)
set(CPACK_COMPONENTS_ALL runtime dev)
foreach(name IN LISTS idist_plugins)
  list(APPEND CPACK_COMPONENTS_ALL backend-${name})
endforeach()
# idist::torch, where libtorch was found: one package for the library, its header, CMake targets
# and pkg-config file (a consumer of it compiles against libtorch-dev anyway).
if(TARGET idist_torch)
  list(APPEND CPACK_COMPONENTS_ALL torch torch-dev)
  set(CPACK_COMPONENT_TORCH-DEV_GROUP torch)
  set(CPACK_COMPONENT_TORCH_GROUP torch)
endif()

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# libidist.so.0 comes from the idist package itself: dpkg-shlibdeps finds it here, in the
# staging tree, and the Depends below cover it.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/lib)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME idist)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION net)
# A shlibs file, so that dpkg-shlibdeps of a program linking libidist.so.0 finds its package
# (a global setting: CMake 3.25 has no per-component one; the plugins have no SONAME to list).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
  "idist-run, the launcher (SLURM, mpirun, torchrun-style variables, or its own ranks), libidist (collectives; gloo built in) and libidist-launch (idist::spawn)")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME idist-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "idist (= ${PROJECT_VERSION})")
set(CPACK_COMPONENT_DEV_DESCRIPTION
  "C++20 headers, find_package(idist) (idist::idist, idist::launch) and pkg-config files (idist, idist-launch)")

foreach(name IN LISTS idist_plugins)
  string(TOUPPER "BACKEND-${name}" component)
  set(CPACK_DEBIAN_${component}_PACKAGE_NAME idist-backend-${name})
  set(CPACK_DEBIAN_${component}_PACKAGE_SECTION libs)
  set(CPACK_DEBIAN_${component}_PACKAGE_DEPENDS "idist (= ${PROJECT_VERSION})")
  set(CPACK_COMPONENT_${component}_DESCRIPTION "The ${name} backend of libidist, loaded when a program asks for it")
endforeach()
if(TARGET idist_torch)
  set(CPACK_DEBIAN_TORCH_PACKAGE_NAME idist-torch)
  set(CPACK_DEBIAN_TORCH_PACKAGE_SECTION libdevel)
  set(CPACK_DEBIAN_TORCH_PACKAGE_DEPENDS "idist-dev (= ${PROJECT_VERSION}), libtorch-dev")
  set(CPACK_COMPONENT_GROUP_TORCH_DESCRIPTION
    "idist::torch: ignite's auto_model (DDP), auto_dataloader and auto_optim and the collectives on torch tensors, for libtorch programs: libidist-torch, <idist/torch.hpp>, find_package(idist COMPONENTS torch), idist-torch.pc")
endif()
# CUDA's runtime and NCCL usually come from NVIDIA's installers rather than from packages that
# dpkg-shlibdeps knows, so the nccl package cannot depend on them: it says so instead.
set(CPACK_COMPONENT_BACKEND-NCCL_DESCRIPTION
  "The nccl backend of libidist (GPU collectives). Needs the CUDA runtime and NCCL it was built with (libcudart, libnccl.so.2) on the library path.")

include(CPack)
