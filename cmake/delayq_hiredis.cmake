# hiredis for the Redis backend, found the same way when delayq is built and when an installed
# delayq is used (delayqConfig.cmake includes this file with DELAYQ_HIREDIS_FIND_ONLY set).
#
# Order: pkg-config (hiredis.pc ships with 0.14 and 1.x alike), then hiredis 1.x's CMake package
# (hiredis::hiredis), then Debian 0.14's HiredisConfig.cmake, which only sets variables.
# Result: DELAYQ_HIREDIS_TARGET names a target to link, or is empty.

function(_delayq_find_hiredis)
  set(DELAYQ_HIREDIS_TARGET "" PARENT_SCOPE)
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(DELAYQ_HIREDIS QUIET IMPORTED_TARGET GLOBAL hiredis)
    if(TARGET PkgConfig::DELAYQ_HIREDIS)
      set(DELAYQ_HIREDIS_TARGET PkgConfig::DELAYQ_HIREDIS PARENT_SCOPE)
      set(DELAYQ_HIREDIS_VERSION "${DELAYQ_HIREDIS_VERSION}" PARENT_SCOPE)
      return()
    endif()
  endif()
  find_package(hiredis CONFIG QUIET)
  if(TARGET hiredis::hiredis)
    set(DELAYQ_HIREDIS_TARGET hiredis::hiredis PARENT_SCOPE)
    set(DELAYQ_HIREDIS_VERSION "${hiredis_VERSION}" PARENT_SCOPE)
    return()
  endif()
  # A version must be asked for: Debian's HiredisConfigVersion.cmake fails without one.
  find_package(Hiredis 0.13 CONFIG QUIET)
  if(HIREDIS_INCLUDE_DIRS AND HIREDIS_LIBRARIES)
    if(NOT TARGET delayq_hiredis_legacy)
      add_library(delayq_hiredis_legacy INTERFACE IMPORTED GLOBAL)
      set_target_properties(delayq_hiredis_legacy PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${HIREDIS_INCLUDE_DIRS}"
        INTERFACE_LINK_LIBRARIES "${HIREDIS_LIBRARIES}")
    endif()
    set(DELAYQ_HIREDIS_TARGET delayq_hiredis_legacy PARENT_SCOPE)
    set(DELAYQ_HIREDIS_VERSION "${Hiredis_VERSION}" PARENT_SCOPE)
  endif()
endfunction()

_delayq_find_hiredis()

if(NOT DELAYQ_HIREDIS_FIND_ONLY)
  if(DELAYQ_HIREDIS_TARGET)
    message(STATUS "delayq: Redis backend enabled (hiredis ${DELAYQ_HIREDIS_VERSION} via ${DELAYQ_HIREDIS_TARGET})")
    add_library(delayq_redis INTERFACE)
    add_library(delayq::redis ALIAS delayq_redis)
    set_target_properties(delayq_redis PROPERTIES EXPORT_NAME redis)
    # The installed package finds hiredis again on the consumer's machine (delayqConfig.cmake), so
    # the build-tree target name stays out of the export.
    target_link_libraries(delayq_redis INTERFACE delayq::delayq $<BUILD_INTERFACE:${DELAYQ_HIREDIS_TARGET}>)
    if(DELAYQ_INSTALL)
      install(FILES ${CMAKE_CURRENT_LIST_DIR}/delayq_hiredis.cmake
              DESTINATION ${CMAKE_INSTALL_DATADIR}/delayq/cmake)
    endif()
  else()
    message(STATUS "delayq: hiredis not found, the Redis backend (delayq::redis) is not built")
  endif()
endif()
