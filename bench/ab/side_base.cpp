// The base side: another revision's headers (scripts/ab puts them first on the include path),
// every name of theirs moved to namespace delayq_base so that both sides live in one program.
#define delayq delayq_base
#define AB_MAKE make_base
#include "workloads.hpp"
