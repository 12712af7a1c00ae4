#include <delayq/delayq.hpp>

int main() {
    delayq::delay_queue<delayq::delayed<int>> q;
    q.put(delayq::delay_for(42, std::chrono::milliseconds(1)));
    auto v = q.take();
    return v && v->value == 42 ? 0 : 1;
}
