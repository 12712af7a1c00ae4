# pkg-config files, for Meson and plain-Makefile users of the installed headers: delayq.pc, and
# delayq-redis.pc when the Redis target exists. They go to <datadir>/pkgconfig (header-only: nothing
# depends on the architecture) and find the prefix relative to themselves, so that
# `cmake --install --prefix` elsewhere still gives working files.
set(DELAYQ_PC_DIR ${CMAKE_INSTALL_DATADIR}/pkgconfig)
if(IS_ABSOLUTE "${DELAYQ_PC_DIR}")
  set(DELAYQ_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _delayq_up "/prefix/${DELAYQ_PC_DIR}" "/prefix")
  string(REGEX REPLACE "/$" "" _delayq_up "${_delayq_up}")
  set(DELAYQ_PC_PREFIX "\${pcfiledir}/${_delayq_up}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(DELAYQ_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(DELAYQ_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/delayq.pc.in ${PROJECT_BINARY_DIR}/delayq.pc @ONLY)
set(_delayq_pc_files ${PROJECT_BINARY_DIR}/delayq.pc)
if(TARGET delayq_redis)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/delayq-redis.pc.in ${PROJECT_BINARY_DIR}/delayq-redis.pc @ONLY)
  list(APPEND _delayq_pc_files ${PROJECT_BINARY_DIR}/delayq-redis.pc)
endif()
install(FILES ${_delayq_pc_files} DESTINATION ${DELAYQ_PC_DIR})
