# cmake -DDELAYQ_SOURCE=... -DWORK=... -DMODE=find_package|add_subdirectory|fetchcontent -P this
file(REMOVE_RECURSE ${WORK})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
endfunction()

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
