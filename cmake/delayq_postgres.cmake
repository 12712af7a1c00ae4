# libpq for the PostgreSQL backend (delayq::postgres), found the same way when delayq is built and
# when an installed delayq is used (delayqConfig.cmake includes this file with
# DELAYQ_POSTGRES_FIND_ONLY set). CMake's own FindPostgreSQL module defines PostgreSQL::PostgreSQL
# (Debian: libpq-dev). Result: DELAYQ_POSTGRES_TARGET names a target to link, or is empty.
find_package(PostgreSQL QUIET)
if(TARGET PostgreSQL::PostgreSQL)
  set(DELAYQ_POSTGRES_TARGET PostgreSQL::PostgreSQL)
else()
  set(DELAYQ_POSTGRES_TARGET "")
endif()

if(NOT DELAYQ_POSTGRES_FIND_ONLY)
  if(DELAYQ_POSTGRES_TARGET)
    message(STATUS "delayq: PostgreSQL backend enabled (libpq ${PostgreSQL_VERSION_STRING})")
    add_library(delayq_postgres INTERFACE)
    add_library(delayq::postgres ALIAS delayq_postgres)
    set_target_properties(delayq_postgres PROPERTIES EXPORT_NAME postgres)
    # As for SQLite: the installed package finds libpq again on the consumer's machine.
    target_link_libraries(delayq_postgres INTERFACE delayq::delayq $<BUILD_INTERFACE:${DELAYQ_POSTGRES_TARGET}>)
    if(DELAYQ_INSTALL)
      install(FILES ${CMAKE_CURRENT_LIST_DIR}/delayq_postgres.cmake
              DESTINATION ${CMAKE_INSTALL_DATADIR}/delayq/cmake)
    endif()
  else()
    message(STATUS "delayq: libpq not found, the PostgreSQL backend (delayq::postgres) is not built")
  endif()
endif()
