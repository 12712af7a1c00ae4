# ctest driver of one fuzz target: a fresh scratch directory for the inputs it finds (the committed
# corpus is only read), crash artifacts next to it, a fixed seed so that CI is reproducible.
file(REMOVE_RECURSE ${SCRATCH})
file(MAKE_DIRECTORY ${SCRATCH}/new ${SCRATCH}/artifacts)
execute_process(
  COMMAND ${FUZZER} -runs=${RUNS} -seed=1 -max_len=4096 -timeout=60 -rss_limit_mb=2048
          -print_final_stats=1 -artifact_prefix=${SCRATCH}/artifacts/
          ${SCRATCH}/new ${CORPUS}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (${rc}); the input is in ${SCRATCH}/artifacts/")
endif()
