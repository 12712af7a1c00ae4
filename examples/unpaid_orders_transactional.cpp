// Cancel unpaid orders after 30 minutes, with the order and its timeout written in one
// transaction: delayq::postgres's put_after_in_transaction() joins the application's own
// transaction on its own connection, so the timeout job exists exactly when the order does. A
// crash between the two writes cannot leave an order that never times out, nor a timeout for an
// order that was never stored; a rollback leaves neither. The payment is the other half:
// cancel_in_transaction() removes the timeout in the payment's transaction, so a paid order keeps
// no timeout, and a payment that rolls back keeps it.
//
//   example_unpaid_orders_transactional "host=127.0.0.1 port=5432 dbname=shop user=shop"
//
// (ctest runs it against a private server: unpaid_orders_transactional.sh.) A demo cannot wait 30
// minutes: once the orders are placed, it moves their timeouts to now with reschedule().
#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <delayq/postgres/delay_queue.hpp>
#include <delayq/worker.hpp>
#include <latch>
#include <stdexcept>
#include <string>

using namespace std::chrono_literals;

namespace {

// The application's own connection and its SQL; any failure ends the demo.
struct database {
    PGconn* conn;
    explicit database(const char* conninfo) : conn(PQconnectdb(conninfo)) {
        if (PQstatus(conn) != CONNECTION_OK) throw std::runtime_error(PQerrorMessage(conn));
    }
    ~database() { PQfinish(conn); }
    database(const database&) = delete;
    database& operator=(const database&) = delete;

    std::string exec(const std::string& sql) {
        PGresult* r = PQexec(conn, sql.c_str());
        const auto st = PQresultStatus(r);
        std::string out = st == PGRES_TUPLES_OK && PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "";
        const std::string err = PQresultErrorMessage(r);
        PQclear(r);
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) throw std::runtime_error(err);
        return out;
    }
};

// Stores order `id` and its payment timeout in one transaction; `fail` stands for anything that
// goes wrong after both writes (a payment provider that refuses, a crash): the transaction is
// rolled back.
void place_order(database& db, delayq::postgres::delay_queue& timeouts, int id, bool fail) {
    const std::string key = "order-" + std::to_string(id);
    db.exec("BEGIN");
    db.exec("INSERT INTO orders(id, status) VALUES (" + std::to_string(id) + ", 'unpaid')");
    timeouts.put_after_in_transaction(db.conn, key, std::to_string(id), 30min);
    if (fail) {
        db.exec("ROLLBACK");
        std::printf("order %d: checkout failed, rolled back\n", id);
        return;
    }
    db.exec("COMMIT");
    std::printf("order %d: stored, with its 30-minute timeout\n", id);
}

// Marks order `id` paid and cancels its timeout in one transaction; `fail` rolls it back (the
// payment did not go through): the order stays unpaid, its timeout queued.
void pay_order(database& db, delayq::postgres::delay_queue& timeouts, int id, bool fail) {
    db.exec("BEGIN");
    db.exec("UPDATE orders SET status = 'paid' WHERE id = " + std::to_string(id));
    timeouts.cancel_in_transaction(db.conn, "order-" + std::to_string(id));
    db.exec(fail ? "ROLLBACK" : "COMMIT");
    std::printf("order %d: %s\n", id, fail ? "payment failed, rolled back" : "paid");
}

}  // namespace

int main(int argc, char** argv) try {
    const char* conninfo = argc > 1 ? argv[1] : "";
    database db(conninfo);
    db.exec("CREATE TABLE IF NOT EXISTS orders(id integer PRIMARY KEY, status text NOT NULL)");
    db.exec("TRUNCATE orders");

    delayq::postgres::options o;
    o.conninfo = conninfo;
    o.name = "unpaid-orders";
    delayq::postgres::delay_queue timeouts(o);  // creates the queue's tables on first use
    while (auto stale = timeouts.take(0ms)) timeouts.ack(*stale);  // a fresh demo
    for (int id = 1; id <= 3; ++id) timeouts.cancel("order-" + std::to_string(id));

    place_order(db, timeouts, 1, false);
    place_order(db, timeouts, 2, true);  // rolled back: no order 2, no timeout for it
    place_order(db, timeouts, 3, false);
    pay_order(db, timeouts, 3, true);   // its timeout stays: the order is still unpaid
    pay_order(db, timeouts, 3, false);  // paid in time: its timeout goes with the payment

    const std::string orders = db.exec("SELECT count(*) FROM orders");
    std::printf("orders stored: %s, timeouts queued: %zu\n", orders.c_str(), timeouts.size());
    if (orders != "2" || timeouts.size() != 1) return 1;

    // Thirty minutes later (here: now), a worker runs each timeout: it cancels the order if it is
    // still unpaid, in one transaction with the order's update; the ack comes after it (a crash
    // in between runs it again, and finds the order cancelled already).
    timeouts.reschedule("order-1", 0ms);
    std::atomic<int> cancelled{0};
    std::latch done(1);
    delayq::worker reaper(timeouts, [&](const delayq::job& job) {
        db.exec("BEGIN");
        try {
            const std::string status =
                db.exec("SELECT status FROM orders WHERE id = " + job.payload + " FOR UPDATE");
            if (status == "unpaid") {
                db.exec("UPDATE orders SET status = 'cancelled' WHERE id = " + job.payload);
                ++cancelled;
            }
            db.exec("COMMIT");
            std::printf("order %s: timeout came, it was %s\n", job.payload.c_str(), status.c_str());
        } catch (...) {
            db.exec("ROLLBACK");
            throw;  // the worker tries the job again later
        }
        done.count_down();
    });
    done.wait();
    reaper.stop();
    std::printf("cancelled %d unpaid order(s); order 2 never existed, order 3 was paid\n",
                cancelled.load());
    return cancelled == 1 ? 0 : 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
}
