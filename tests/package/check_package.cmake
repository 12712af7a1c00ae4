# cmake -DDELAYQ_SOURCE=... -DWORK=... -DDELAYQ_VERSION=X.Y.Z
#       -DMODE=find_package|add_subdirectory|fetchcontent|fetchcontent-git|pkg-config|versions
#       [-DPKG_CONFIG=... -DMAKE=...] [-DGIT=...] [-DEXPECT=sqlite;redis] -P this
file(REMOVE_RECURSE ${WORK})
string(REGEX MATCH "^[0-9]+\\.[0-9]+" DELAYQ_REQUEST "${DELAYQ_VERSION}")
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
endfunction()

if(MODE STREQUAL "versions")
  # The version is written once (include/delayq/version.hpp); what the docs say a user writes
  # must name it: the README's find_package(delayq MAJOR.MINOR ...) and GIT_TAG vX.Y.Z, and a
  # CHANGELOG.md section for it.
  file(READ ${DELAYQ_SOURCE}/README.md _readme)
  file(READ ${DELAYQ_SOURCE}/CHANGELOG.md _changelog)
  string(REGEX MATCHALL "find_package\\(delayq [0-9.]+" _asks "${_readme}")
  string(REGEX MATCHALL "GIT_TAG v[0-9.]+" _tags "${_readme}")
  if(NOT _asks OR NOT _tags)
    message(FATAL_ERROR "README.md shows no find_package(delayq X.Y ...) or no GIT_TAG vX.Y.Z")
  endif()
  foreach(_a IN LISTS _asks)
    if(NOT _a STREQUAL "find_package(delayq ${DELAYQ_REQUEST}")
      message(FATAL_ERROR "README.md: '${_a}', but the version is ${DELAYQ_VERSION} (version.hpp)")
    endif()
  endforeach()
  foreach(_t IN LISTS _tags)
    if(NOT _t STREQUAL "GIT_TAG v${DELAYQ_VERSION}")
      message(FATAL_ERROR "README.md: '${_t}', but the version is ${DELAYQ_VERSION} (version.hpp)")
    endif()
  endforeach()
  string(FIND "${_changelog}" "## [${DELAYQ_VERSION}]" _at)
  if(_at LESS 0)
    message(FATAL_ERROR "CHANGELOG.md has no section '## [${DELAYQ_VERSION}]'")
  endif()
  message(STATUS "README.md and CHANGELOG.md name version ${DELAYQ_VERSION}: ok")
  return()
endif()

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
       ${CMAKE_CURRENT_LIST_DIR}/consumer/sqlite_main.cpp
       ${CMAKE_CURRENT_LIST_DIR}/consumer/postgres_main.cpp DESTINATION ${WORK}/make)
  set(_env ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${_pc_dir} PKG_CONFIG=${PKG_CONFIG} CXX=${CXX})
  run(${_env} ${PKG_CONFIG} --exact-version=${DELAYQ_VERSION} delayq)
  run(${_env} ${MAKE} -C ${WORK}/make consumer)
  run(${WORK}/make/consumer)
  if(EXISTS ${_pc_dir}/delayq-sqlite.pc)
    run(${_env} ${MAKE} -C ${WORK}/make sqlite)
    execute_process(COMMAND ${WORK}/make/sqlite_consumer WORKING_DIRECTORY ${WORK}/make
                    RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "sqlite_consumer (built through delayq-sqlite.pc) failed (${rc})")
    endif()
  elseif("sqlite" IN_LIST EXPECT)
    message(FATAL_ERROR "install did not put delayq-sqlite.pc in ${_pc_dir}")
  endif()
  if(EXISTS ${_pc_dir}/delayq-postgres.pc)
    run(${_env} ${MAKE} -C ${WORK}/make postgres)
    run(${WORK}/make/postgres_consumer)
  elseif("postgres" IN_LIST EXPECT)
    message(FATAL_ERROR "install did not put delayq-postgres.pc in ${_pc_dir}")
  endif()
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

set(_consumer_args -DDELAYQ_SOURCE=${DELAYQ_SOURCE} -DMODE=${MODE} -DDELAYQ_VERSION=${DELAYQ_VERSION}
    -DDELAYQ_REQUEST=${DELAYQ_REQUEST})
if(MODE STREQUAL "fetchcontent-git")
  # The README's FetchContent lines name a release tag, vX.Y.Z. A repository holding this source
  # tree (committed or not), tagged so, stands in for the one a user clones from.
  execute_process(COMMAND ${GIT} -C ${DELAYQ_SOURCE} ls-files -co --exclude-standard
                  OUTPUT_VARIABLE _files RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "git ls-files failed in ${DELAYQ_SOURCE}")
  endif()
  string(REPLACE "\n" ";" _files "${_files}")
  foreach(_f IN LISTS _files)
    if(_f AND EXISTS ${DELAYQ_SOURCE}/${_f} AND NOT IS_DIRECTORY ${DELAYQ_SOURCE}/${_f})
      get_filename_component(_d ${_f} DIRECTORY)
      file(COPY ${DELAYQ_SOURCE}/${_f} DESTINATION ${WORK}/repo/${_d})
    endif()
  endforeach()
  set(_git ${GIT} -C ${WORK}/repo -c user.name=delayq -c user.email=delayq@localhost
           -c commit.gpgsign=false -c tag.gpgsign=false)
  run(${_git} init -q)
  run(${_git} add -A)
  run(${_git} commit -q -m "delayq ${DELAYQ_VERSION}")
  run(${_git} tag v${DELAYQ_VERSION})
  list(APPEND _consumer_args -DDELAYQ_GIT=file://${WORK}/repo)
endif()
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
  # The package version file: 0.x versions differ in their API, so another minor or major
  # version asked for must not be found.
  file(WRITE ${WORK}/probe/CMakeLists.txt
       "cmake_minimum_required(VERSION 3.20)\nproject(probe LANGUAGES CXX)\n"
       "find_package(delayq \${ASK} CONFIG QUIET)\n"
       "if(delayq_FOUND)\n  message(FATAL_ERROR \"found delayq \${delayq_VERSION} when \${ASK} was asked for\")\nendif()\n")
  string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _ ${DELAYQ_VERSION})
  math(EXPR _next_minor "${CMAKE_MATCH_2} + 1")
  math(EXPR _next_major "${CMAKE_MATCH_1} + 1")
  foreach(_ask ${CMAKE_MATCH_1}.${_next_minor} ${_next_major}.0)
    run(${CMAKE_COMMAND} -S ${WORK}/probe -B ${WORK}/probe/build-${_ask} -DASK=${_ask}
        -DCMAKE_PREFIX_PATH=${WORK}/prefix)
  endforeach()
endif()
run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/consumer -B ${WORK}/consumer -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} ${_consumer_args})
run(${CMAKE_COMMAND} --build ${WORK}/consumer)
run(${WORK}/consumer/consumer)
# The backends' targets, where the build that runs this test has them.
foreach(_backend IN LISTS EXPECT)
  if(NOT EXISTS ${WORK}/consumer/${_backend}_consumer)
    message(FATAL_ERROR "delayq::${_backend} was not defined for the consumer (${MODE})")
  endif()
  execute_process(COMMAND ${WORK}/consumer/${_backend}_consumer WORKING_DIRECTORY ${WORK}/consumer
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${_backend}_consumer failed (${rc}) (${MODE})")
  endif()
endforeach()
message(STATUS "delayq ${DELAYQ_VERSION} consumed by ${MODE}: ok (also: ${EXPECT})")
