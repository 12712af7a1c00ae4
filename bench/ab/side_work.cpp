// The working tree's side.
#define AB_MAKE make_work
#include "workloads.hpp"
