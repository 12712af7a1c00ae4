# cmake -DDELAYQ_SOURCE=... -DWORK=... -DMODE=find_package|add_subdirectory|fetchcontent|pkg-config
#       [-DPKG_CONFIG=... -DMAKE=...] -P this
file(REMOVE_RECURSE ${WORK})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
endfunction()

if(MODE STREQUAL "pkg-config")
  # Configured for one prefix, installed to another: the .pc files must find the headers from
  # where they lie. Then a plain Makefile builds with `pkg-config --cflags --libs delayq`.
  run(${CMAKE_COMMAND} -S ${DELAYQ_SOURCE} -B ${WORK}/delayq -G ${GENERATOR}
      -DCMAKE_CXX_COMPILER=${CXX} -DDELAYQ_BUILD_TESTS=OFF -DDELAYQ_BUILD_BENCHMARKS=OFF
      -DDELAYQ_BUILD_EXAMPLES=OFF -DCMAKE_INSTALL_PREFIX=${WORK}/not-here)
  run(${CMAKE_COMMAND} --install ${WORK}/delayq --prefix ${WORK}/prefix)
  set(_pc_dir ${WORK}/prefix/share/pkgconfig)
  if(NOT EXISTS ${_pc_dir}/delayq.pc)
    message(FATAL_ERROR "install did not put delayq.pc in ${_pc_dir}")
  endif()
  file(COPY ${CMAKE_CURRENT_LIST_DIR}/pkgconfig/ ${CMAKE_CURRENT_LIST_DIR}/consumer/main.cpp
       DESTINATION ${WORK}/make)
  set(_env ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${_pc_dir} PKG_CONFIG=${PKG_CONFIG} CXX=${CXX})
  run(${_env} ${PKG_CONFIG} --exact-version=${DELAYQ_VERSION} delayq)
  run(${_env} ${MAKE} -C ${WORK}/make consumer)
  run(${WORK}/make/consumer)
  # delayq-redis.pc exists when the Redis target did; it needs hiredis.pc to resolve.
  if(EXISTS ${_pc_dir}/delayq-redis.pc)
    run(${_env} ${MAKE} -C ${WORK}/make redis)
    run(${WORK}/make/redis_consumer)
    message(STATUS "delayq and delayq-redis consumed by pkg-config: ok")
  else()
    message(STATUS "delayq consumed by pkg-config: ok (no Redis target, no delayq-redis.pc)")
  endif()
  return()
endif()

set(_consumer_args -DDELAYQ_SOURCE=${DELAYQ_SOURCE} -DMODE=${MODE})
if(MODE STREQUAL "find_package")
  # Install delayq alone (no tests/benchmarks/examples) into a fresh prefix.
  run(${CMAKE_COMMAND} -S ${DELAYQ_SOURCE} -B ${WORK}/delayq -G ${GENERATOR}
      -DCMAKE_CXX_COMPILER=${CXX} -DDELAYQ_BUILD_TESTS=OFF -DDELAYQ_BUILD_BENCHMARKS=OFF
      -DDELAYQ_BUILD_EXAMPLES=OFF -DCMAKE_INSTALL_PREFIX=${WORK}/prefix)
  run(${CMAKE_COMMAND} --install ${WORK}/delayq)
  if(NOT EXISTS ${WORK}/prefix/include/delayq/delayq.hpp)
    message(FATAL_ERROR "install did not put the headers in ${WORK}/prefix/include")
  endif()
  list(APPEND _consumer_args -DCMAKE_PREFIX_PATH=${WORK}/prefix)
endif()
run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/consumer -B ${WORK}/consumer -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} ${_consumer_args})
run(${CMAKE_COMMAND} --build ${WORK}/consumer)
run(${WORK}/consumer/consumer)
message(STATUS "delayq consumed by ${MODE}: ok")
