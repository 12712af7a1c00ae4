// How a test shows that callers who fail together (one failed group commit, one failed claim)
// each get an exception of their own: each caller records what it caught, keeps it alive until
// every caller caught (so that no address is reused), and then reads its what() over and over
// while the others let go of theirs, where ThreadSanitizer sees a message that two share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <set>
#include <string>
#include <vector>

#include "catch.hpp"

namespace delayq::test {

/// What one caller caught.
struct caught {
    std::uintptr_t object = 0, text = 0;  // the exception's address, its what()'s
    std::string type, message;
    std::exception_ptr kept;  // until every caller caught: the addresses stay apart
    std::size_t length = 0;   // what() read over and over: its characters

    /// In the handler that caught `e`, named `t`.
    void record(const std::exception& e, std::string t) {
        object = reinterpret_cast<std::uintptr_t>(&e);
        text = reinterpret_cast<std::uintptr_t>(e.what());
        type = std::move(t);
        message = e.what();
        kept = std::current_exception();
    }
    /// Once every caller recorded: lets go of the kept exception and reads `e`'s message.
    void read_apart(const std::exception& e) {
        kept = nullptr;
        std::size_t sum = 0;
        for (int k = 0; k < reads; ++k)
            for (const char* t = e.what(); *t != '\0'; ++t) ++sum;
        length = sum;  // no atomic here: it would order the threads, and hide the race
    }
    static constexpr int reads = 200;
};

/// Each of `got` caught the same message, in an exception object and a message of its own.
template <class Caught>
void check_apart(const std::vector<Caught>& got) {
    std::set<std::uintptr_t> objects, texts;
    for (const caught& c : got) {
        INFO(c.type << ": " << c.message);
        CHECK(c.message == got[0].message);
        CHECK(c.length == caught::reads * c.message.size());
        objects.insert(c.object);
        texts.insert(c.text);
    }
    CHECK(objects.size() == got.size());  // one exception object each
    CHECK(texts.size() == got.size());    // and a message of its own
}

}  // namespace delayq::test
