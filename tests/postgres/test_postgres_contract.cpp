// The behaviour suite of delayq::job_queue (tests/contract/) against delayq::postgres::delay_queue,
// on a PostgreSQL server of the test process's own.
#include <tuple>

#include "pg_fixture.hpp"

using delayq_contract_fixtures = std::tuple<delayq_pg_test::fixture>;

#include "contract/job_queue_contract.hpp"
