# `docs`: the Doxygen API reference of the public headers, in <build>/docs/html. Its warnings (an
# undocumented public member, a broken command) are written to <build>/docs/warnings.log;
# scripts/docs builds this target and fails when that log is not empty.
find_package(Doxygen QUIET)
if(DOXYGEN_FOUND)
  set(DELAYQ_DOCS_OUT ${PROJECT_BINARY_DIR}/docs)
  configure_file(${PROJECT_SOURCE_DIR}/docs/reference/Doxyfile.in ${DELAYQ_DOCS_OUT}/Doxyfile @ONLY)
  file(GLOB_RECURSE _delayq_doc_inputs CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/include/delayq/*.hpp ${PROJECT_SOURCE_DIR}/docs/reference/*)
  add_custom_command(
    OUTPUT ${DELAYQ_DOCS_OUT}/html/index.html
    COMMAND ${CMAKE_COMMAND} -E rm -f ${DELAYQ_DOCS_OUT}/warnings.log
    COMMAND Doxygen::doxygen ${DELAYQ_DOCS_OUT}/Doxyfile
    DEPENDS ${_delayq_doc_inputs} ${DELAYQ_DOCS_OUT}/Doxyfile
    WORKING_DIRECTORY ${DELAYQ_DOCS_OUT}
    COMMENT "Doxygen: the API reference in ${DELAYQ_DOCS_OUT}/html")
  add_custom_target(docs DEPENDS ${DELAYQ_DOCS_OUT}/html/index.html)
else()
  message(STATUS "delayq: doxygen not found, no `docs` target")
endif()
