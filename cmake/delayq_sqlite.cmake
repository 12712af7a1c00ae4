# SQLite 3 for the durable embedded backend (delayq::sqlite), found the same way when delayq is
# built and when an installed delayq is used (delayqConfig.cmake includes this file with
# DELAYQ_SQLITE_FIND_ONLY set). CMake's own FindSQLite3 module defines SQLite::SQLite3 (Debian:
# libsqlite3-dev). Result: DELAYQ_SQLITE_TARGET names a target to link, or is empty.
find_package(SQLite3 QUIET)
if(TARGET SQLite::SQLite3)
  set(DELAYQ_SQLITE_TARGET SQLite::SQLite3)
else()
  set(DELAYQ_SQLITE_TARGET "")
endif()

if(NOT DELAYQ_SQLITE_FIND_ONLY)
  if(DELAYQ_SQLITE_TARGET)
    message(STATUS "delayq: SQLite backend enabled (SQLite ${SQLite3_VERSION})")
    add_library(delayq_sqlite INTERFACE)
    add_library(delayq::sqlite ALIAS delayq_sqlite)
    set_target_properties(delayq_sqlite PROPERTIES EXPORT_NAME sqlite)
    # As for hiredis: the installed package finds SQLite again on the consumer's machine.
    target_link_libraries(delayq_sqlite INTERFACE delayq::delayq $<BUILD_INTERFACE:${DELAYQ_SQLITE_TARGET}>)
    if(DELAYQ_INSTALL)
      install(FILES ${CMAKE_CURRENT_LIST_DIR}/delayq_sqlite.cmake
              DESTINATION ${CMAKE_INSTALL_DATADIR}/delayq/cmake)
    endif()
  else()
    message(STATUS "delayq: SQLite 3 not found, the SQLite backend (delayq::sqlite) is not built")
  endif()
endif()
