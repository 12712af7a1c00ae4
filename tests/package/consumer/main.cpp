// A user of delayq: the heap, and the version the build says it installed.
#include <cstring>
#include <delayq/delayq.hpp>

int main() {
    delayq::delay_queue<delayq::delayed<int>> q;
    q.put(delayq::delay_for(42, std::chrono::milliseconds(1)));
    auto v = q.take();
#ifdef DELAYQ_EXPECTED_VERSION
    if (std::strcmp(delayq::version_string, DELAYQ_EXPECTED_VERSION) != 0) return 2;
#endif
    static_assert(DELAYQ_VERSION ==
                  DELAYQ_VERSION_MAJOR * 10000 + DELAYQ_VERSION_MINOR * 100 + DELAYQ_VERSION_PATCH);
    return v && v->value == 42 ? 0 : 1;
}
