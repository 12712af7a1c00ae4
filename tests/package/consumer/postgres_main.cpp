// A user of delayq::postgres: the header compiles and links with what the package names. It
// connects to no server unless given a libpq connection string, so the package test can run it.
#include <delayq/postgres/delay_queue.hpp>

int main(int argc, char** argv) {
    if (argc < 2) return 0;
    delayq::postgres::options o;
    o.conninfo = argv[1];
    o.name = "package-test";
    delayq::postgres::delay_queue q(o);
    return q.size() == 0 ? 0 : 1;
}
