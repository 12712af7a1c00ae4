# cmake -DCXX=compiler -DINCLUDE=<delayq>/include -DWORK=dir -P below_cxx20.cmake
#
# Compiled as C++17 (g++ 12's default, or a pkg-config user whose flags carry no -std), each public
# header must stop at one clear line, delayq/detail/config.hpp's #error, and not go on into pages
# of errors from the code after it (std::span, concepts). Each is compiled from a one-line program
# that includes it; the output must hold the message and no error beyond it and the line that
# stops the compiler there. Public: the headers outside detail/, less version.hpp (plain C++17,
# so that a C++17 program may test the version) and the Redis backend's parts that its
# delay_queue.hpp includes first thing (queue.hpp, types.hpp).
cmake_minimum_required(VERSION 3.20)
set(_message "delayq needs C++20: compile with -std=c++20 (or CMake: target_compile_features(... cxx_std_20))")
file(GLOB_RECURSE _headers RELATIVE ${INCLUDE} ${INCLUDE}/delayq/*.hpp)
list(FILTER _headers EXCLUDE REGEX "/detail/|^delayq/version\\.hpp$|^delayq/redis/(queue|types)\\.hpp$")
list(SORT _headers)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(_failed "")
foreach(_header IN LISTS _headers)
  string(REPLACE "/" "__" _name "${_header}")
  file(WRITE ${WORK}/${_name}.cpp "#include <${_header}>\nint main() {}\n")
  execute_process(COMMAND ${CXX} -std=c++17 -fsyntax-only -I${INCLUDE} ${WORK}/${_name}.cpp
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  string(FIND "${_out}" "${_message}" _at)
  string(REPLACE ";" "," _errors "${_out}")
  string(REGEX MATCHALL "[^\n]*error:[^\n]*" _errors "${_errors}")
  list(FILTER _errors EXCLUDE REGEX "delayq needs C\\+\\+20|compilation stopped")
  if(_rc EQUAL 0 OR _at LESS 0 OR _errors)
    string(APPEND _failed "\n--- <${_header}> (exit ${_rc}):\n${_out}")
  endif()
endforeach()
list(LENGTH _headers _n)
if(_failed)
  message(FATAL_ERROR "compiled as C++17, these did not stop at '${_message}' alone:${_failed}")
endif()
message(STATUS "${_n} public headers, compiled as C++17, each stop at one line: ${_message}")
