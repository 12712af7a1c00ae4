# cmake -DDELAYQ_SOURCE=... -DWORK=... -DDELAYQ_VERSION=X.Y.Z
#       -DMODE=find_package|add_subdirectory|fetchcontent|fetchcontent-git|pkg-config|versions|
#             install-alone
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
  # must name it: the README's find_package(delayq MAJOR.MINOR ...), a GIT_TAG vX.Y.Z if it shows
  # one (fetchcontent-git checks that the tag exists), and a CHANGELOG.md section for it.
  file(READ ${DELAYQ_SOURCE}/README.md _readme)
  file(READ ${DELAYQ_SOURCE}/CHANGELOG.md _changelog)
  string(REGEX MATCHALL "find_package\\(delayq [0-9.]+" _asks "${_readme}")
  string(REGEX MATCHALL "GIT_TAG v[0-9.]+" _tags "${_readme}")
  if(NOT _asks)
    message(FATAL_ERROR "README.md shows no find_package(delayq X.Y ...)")
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

if(MODE STREQUAL "install-alone")
  # Installing the headers needs CMake and a compiler, nothing else: configured as the README's
  # install lines are, but with Catch2 and Google Benchmark made to look missing, the tests and
  # benchmarks (on by default at top level) are skipped with a message and the install works.
  # Asked for explicitly (-DDELAYQ_BUILD_TESTS=ON, -DDELAYQ_BUILD_BENCHMARKS=ON), a missing one
  # fails the configure instead.
  set(_missing -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=TRUE -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=TRUE)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${DELAYQ_SOURCE} -B ${WORK}/delayq -G ${GENERATOR}
                          -DCMAKE_CXX_COMPILER=${CXX} ${_missing}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configure without Catch2 and benchmark failed (${rc}):\n${out}")
  endif()
  foreach(_what "Catch2 not found: tests not built" "Google Benchmark not found: benchmarks not built")
    string(FIND "${out}" "${_what}" _at)
    if(_at LESS 0)
      message(FATAL_ERROR "configure did not say '${_what}':\n${out}")
    endif()
  endforeach()
  run(${CMAKE_COMMAND} --install ${WORK}/delayq --prefix ${WORK}/prefix)
  if(NOT EXISTS ${WORK}/prefix/include/delayq/delayq.hpp
     OR NOT EXISTS ${WORK}/prefix/share/delayq/cmake/delayqConfig.cmake)
    message(FATAL_ERROR "install did not put the headers and delayqConfig.cmake in ${WORK}/prefix")
  endif()
  foreach(_ask "DELAYQ_BUILD_TESTS;Catch2" "DELAYQ_BUILD_BENCHMARKS;benchmark")
    list(GET _ask 0 _option)
    list(GET _ask 1 _package)
    execute_process(COMMAND ${CMAKE_COMMAND} -S ${DELAYQ_SOURCE} -B ${WORK}/explicit-${_option}
                            -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX} ${_missing}
                            -D${_option}=ON
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(rc EQUAL 0 OR NOT out MATCHES "${_package}")
      message(FATAL_ERROR "-D${_option}=ON without ${_package}: the configure should fail, naming "
                          "${_package} (${rc}):\n${out}")
    endif()
  endforeach()
  message(STATUS "installed without Catch2 and benchmark; asked for, each one's absence fails: ok")
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
  # The README's FetchContent lines, as written: the ref they name (GIT_TAG) must be one that the
  # repository this tree was cloned from has (else a user's FetchContent stops at "invalid
  # reference"), and the lines must build a consumer from a repository that holds this source tree
  # (committed or not) under that ref, with DELAYQ_GIT_URL naming it.
  file(STRINGS ${DELAYQ_SOURCE}/README.md _lines
       REGEX "^(include\\(FetchContent\\)|FetchContent_(Declare|MakeAvailable)\\(delayq[ )])")
  set(_declare ${_lines})
  list(FILTER _declare INCLUDE REGEX "^FetchContent_Declare")
  list(LENGTH _declare _n)
  list(LENGTH _lines _all)
  if(NOT _n EQUAL 1 OR NOT _all EQUAL 3 OR NOT _declare MATCHES "GIT_TAG ([^ )]+)")
    message(FATAL_ERROR "README.md: expected the three lines include(FetchContent), "
                        "FetchContent_Declare(delayq ... GIT_TAG ref), "
                        "FetchContent_MakeAvailable(delayq); found: ${_lines}")
  endif()
  set(_ref ${CMAKE_MATCH_1})
  execute_process(COMMAND ${GIT} -C ${DELAYQ_SOURCE} rev-parse --is-shallow-repository
                  OUTPUT_VARIABLE _shallow OUTPUT_STRIP_TRAILING_WHITESPACE)
  execute_process(COMMAND ${GIT} -C ${DELAYQ_SOURCE} for-each-ref "--format=%(refname)"
                          refs/heads/${_ref} refs/tags/${_ref} refs/remotes/*/${_ref}
                  OUTPUT_VARIABLE _found OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _found AND _ref MATCHES "^[0-9a-f]+$")
    execute_process(COMMAND ${GIT} -C ${DELAYQ_SOURCE} cat-file -e ${_ref}^{commit}
                    RESULT_VARIABLE rc)
    if(rc EQUAL 0)
      set(_found ${_ref})
    endif()
  endif()
  if(NOT _found AND _shallow STREQUAL "true")
    message(STATUS "a shallow clone: whether it has '${_ref}' (README.md's GIT_TAG) is not known")
  elseif(NOT _found)
    message(FATAL_ERROR "README.md's FetchContent names GIT_TAG ${_ref}, which this repository "
                        "has as no branch, tag or commit (git tag; git branch -a): a user's "
                        "FetchContent would fail with 'invalid reference: ${_ref}'")
  endif()
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
  if(_found MATCHES "(^|\n)refs/tags/")
    run(${_git} tag ${_ref})
  elseif(_found MATCHES "^refs/" OR NOT _ref MATCHES "^[0-9a-f]+$")
    run(${_git} branch -M ${_ref})
  else()
    # A commit: this tree's copy has another one; the lines name that instead.
    execute_process(COMMAND ${GIT} -C ${WORK}/repo rev-parse HEAD OUTPUT_VARIABLE _head
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    string(REPLACE "GIT_TAG ${_ref}" "GIT_TAG ${_head}" _lines "${_lines}")
  endif()
  string(REPLACE ";" "\n" _lines "${_lines}")
  file(WRITE ${WORK}/readme_fetchcontent.cmake "${_lines}\n")
  list(APPEND _consumer_args -DDELAYQ_GIT_URL=file://${WORK}/repo
       -DDELAYQ_README_LINES=${WORK}/readme_fetchcontent.cmake)
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
