# A library component of outbox-cpp: its headers as a file set, its warnings (build tree only), and,
# when OUTBOX_INSTALL is on, its install rules, exported targets, CMake dependency script and .pc file.
#
# outbox_component(<component> <target>
#   [HEADERS <dir relative to the source root>...]   headers installed under include/ (tests excluded)
#   [REQUIRES <component>...]                          components this one links publicly
#   [FIND <cmake code>...]                             lines that recreate its imported dependencies
#   [PC_REQUIRES <pkg-config module>...]               pkg-config modules of those dependencies
#   [DEB_DEPENDS <Debian package>...])                 -dev packages a consumer needs for them
include_guard(GLOBAL)
include(GNUInstallDirs)

set(OUTBOX_CMAKE_INSTALL_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/outbox")

function(outbox_component component target)
  cmake_parse_arguments(C "" "" "HEADERS;REQUIRES;FIND;PC_REQUIRES;DEB_DEPENDS" ${ARGN})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${component}
    VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  # Linked by name so that the exported (static) targets do not require the warnings target.
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:outbox_warnings>)

  set(headers "")
  foreach(dir IN LISTS C_HEADERS)
    file(GLOB found CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/${dir}/*.hpp")
    list(FILTER found EXCLUDE REGEX "_test\\.hpp$")
    list(APPEND headers ${found})
  endforeach()
  target_sources(${target} PUBLIC FILE_SET HEADERS BASE_DIRS "${PROJECT_SOURCE_DIR}"
    FILES ${headers})

  set_property(GLOBAL APPEND PROPERTY OUTBOX_COMPONENTS ${component})
  set_property(GLOBAL APPEND PROPERTY OUTBOX_DEB_DEPENDS ${C_DEB_DEPENDS})
  if(NOT OUTBOX_INSTALL)
    return()
  endif()

  install(TARGETS ${target} EXPORT outbox-${component}-targets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
    FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
  install(EXPORT outbox-${component}-targets NAMESPACE outbox::
    DESTINATION ${OUTBOX_CMAKE_INSTALL_DIR} COMPONENT dev)

  # What find_package(outbox COMPONENTS <component>) runs: the components it needs, then its own
  # imported dependencies, then its targets. A missing dependency makes outbox not found (with the
  # reason) instead of failing inside the generated targets file.
  set(script "include_guard(DIRECTORY)\n")
  foreach(required IN LISTS C_REQUIRES)
    string(APPEND script
      "include(\"\${CMAKE_CURRENT_LIST_DIR}/outbox-${required}-dependencies.cmake\")\n"
      "if(DEFINED outbox_FOUND AND NOT outbox_FOUND)\n  return()\nendif()\n")
  endforeach()
  foreach(line IN LISTS C_FIND)
    string(APPEND script "${line}\n")
  endforeach()
  string(APPEND script "include(\"\${CMAKE_CURRENT_LIST_DIR}/outbox-${component}-targets.cmake\")\n")
  file(WRITE "${PROJECT_BINARY_DIR}/outbox-${component}-dependencies.cmake" "${script}")
  install(FILES "${PROJECT_BINARY_DIR}/outbox-${component}-dependencies.cmake"
    DESTINATION ${OUTBOX_CMAKE_INSTALL_DIR} COMPONENT dev)

  # pkg-config: static archives need their dependencies on every link line, so they are Requires;
  # a shared build hides them (Requires.private).
  set(requires "")
  foreach(required IN LISTS C_REQUIRES)
    list(APPEND requires outbox-${required})
  endforeach()
  if(BUILD_SHARED_LIBS)
    list(JOIN requires " " PC_REQUIRES)
    list(JOIN C_PC_REQUIRES " " PC_REQUIRES_PRIVATE)
  else()
    list(APPEND requires ${C_PC_REQUIRES})
    list(JOIN requires " " PC_REQUIRES)
    set(PC_REQUIRES_PRIVATE "")
  endif()
  set(PC_NAME outbox-${component})
  set(PC_LIBRARY ${target})
  file(RELATIVE_PATH PC_PREFIX_FROM_PCFILEDIR
    "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" PC_PREFIX_FROM_PCFILEDIR "${PC_PREFIX_FROM_PCFILEDIR}")
  set(PC_EXTRA_LIBS "")
  if(component STREQUAL "core")
    set(PC_EXTRA_LIBS "-pthread")
  endif()
  configure_file("${PROJECT_SOURCE_DIR}/cmake/outbox.pc.in"
    "${PROJECT_BINARY_DIR}/pkgconfig/${PC_NAME}.pc" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/pkgconfig/${PC_NAME}.pc"
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endfunction()

# The package configuration, version file and CPack settings, once every component is declared.
function(outbox_finish_install)
  get_property(components GLOBAL PROPERTY OUTBOX_COMPONENTS)
  get_property(deb_depends GLOBAL PROPERTY OUTBOX_DEB_DEPENDS)
  list(REMOVE_DUPLICATES deb_depends)
  if(NOT OUTBOX_INSTALL)
    return()
  endif()
  include(CMakePackageConfigHelpers)
  set(OUTBOX_BUILT_COMPONENTS ${components})
  configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/outbox-config.cmake.in"
    "${PROJECT_BINARY_DIR}/outbox-config.cmake" INSTALL_DESTINATION ${OUTBOX_CMAKE_INSTALL_DIR})
  # 0.x: a minor version may break the API, so only the same minor version is compatible.
  write_basic_package_version_file("${PROJECT_BINARY_DIR}/outbox-config-version.cmake"
    COMPATIBILITY SameMinorVersion)
  install(FILES "${PROJECT_BINARY_DIR}/outbox-config.cmake"
    "${PROJECT_BINARY_DIR}/outbox-config-version.cmake"
    DESTINATION ${OUTBOX_CMAKE_INSTALL_DIR} COMPONENT dev)

  set(CPACK_PACKAGE_NAME outbox-cpp)
  set(CPACK_PACKAGE_VENDOR "outbox-cpp")
  set(CPACK_PACKAGE_CONTACT "outbox-cpp maintainers <outbox-cpp@localhost>")
  set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Transactional outbox for C++ services and the outbox relay")
  set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
  set(CPACK_GENERATOR DEB)
  set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
  set(CPACK_DEB_COMPONENT_INSTALL ON)
  # The runtime package holds the outbox command and, in a shared build, the libraries.
  set(CPACK_COMPONENTS_ALL dev)
  if(TARGET outbox_cli OR BUILD_SHARED_LIBS)
    list(PREPEND CPACK_COMPONENTS_ALL runtime)
  endif()
  if(BUILD_SHARED_LIBS)
    list(PREPEND deb_depends "outbox-cpp (= ${PROJECT_VERSION})")
  endif()
  set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
  set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
  set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME outbox-cpp)
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION net)
  # The relay's shared-library dependencies, as dpkg-shlibdeps finds them in the binary.
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
  set(CPACK_DEBIAN_DEV_PACKAGE_NAME outbox-cpp-dev)
  list(JOIN deb_depends ", " dev_depends)
  set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${dev_depends}")
  set(CPACK_COMPONENT_RUNTIME_DESCRIPTION "The outbox command: relay, migrations and dead-event tools")
  set(CPACK_COMPONENT_DEV_DESCRIPTION "outbox-cpp headers, static libraries, CMake and pkg-config files")
  include(CPack)
endfunction()
