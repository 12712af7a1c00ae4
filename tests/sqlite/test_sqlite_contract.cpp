// The behaviour suite of delayq::job_queue (tests/contract/) against delayq::sqlite::delay_queue.
#include <tuple>

#include "sqlite_files.hpp"

using delayq_contract_fixtures = std::tuple<delayq_sqlite_test::fixture>;

#include "contract/job_queue_contract.hpp"
