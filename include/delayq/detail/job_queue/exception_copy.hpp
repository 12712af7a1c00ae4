// A caller's own copy of a failure that answers several callers: the batches of a group commit
// that failed (delayq::sqlite), the takes that one claim was made for (delayq::postgres).
//
// Why. std::exception_ptr lets many threads hold one exception object, and each caller of such a
// failure rethrows what it was handed; yet one caller would then read the message (what()) while
// another thread's last reference destroys the object. libstdc++'s std::runtime_error keeps its
// message in a reference-counted string, shared by every copy of it: a plain copy (the copy
// constructor, make_exception_ptr(x)) still shares the message. The counts are atomic, but they
// are counted inside libstdc++, which ThreadSanitizer does not instrument: it sees a read of the
// message in one thread and its release in another, with nothing ordering them, and reports a data
// race (and one real race hides among such reports). So each caller gets an exception object of
// its own, made before it is woken, of the same type, whose message is a new string.
//
// The copy is made by the backend's `make(x)`, which knows the family's fields:
// `T(std::string(x.what()), x.code())`, `T(std::string(x.what()), x.sqlstate())`. Only an
// exception whose dynamic type is exactly one of the listed types is copied (never a slice of a
// subclass into its base); anything else (std::bad_alloc, a type not listed) and a copy that
// cannot be made (no memory for it) are handed out as they are: shared, which is what the atomic
// counts make safe, if invisible to ThreadSanitizer. Never a crash.
#pragma once

#include <exception>
#include <string>
#include <type_traits>
#include <typeinfo>

namespace delayq::detail {

/// If `x` is exactly a T, sets `out` to a new T made by make(x) and returns true.
template <class T, class Make>
bool copy_if_exactly(const std::exception& x, Make& make, std::exception_ptr& out) {
    if (typeid(x) != typeid(T)) return false;
    const T* t = dynamic_cast<const T*>(&x);
    if (t == nullptr) return false;
    static_assert(std::is_same_v<decltype(make(*t)), T>,
                  "make(x) must return a new exception of x's own type");
    out = std::make_exception_ptr(make(*t));
    return true;
}

/// The exception of `e` again, for one of the several callers that it answers: a new object of
/// the same type with a message of its own, made by make(x) (see the top of the file), when the
/// dynamic type of the exception is one of `Types`; `e` itself otherwise, and when the copy could
/// not be made. Null for null.
template <class... Types, class Make>
std::exception_ptr copy_for_caller(const std::exception_ptr& e, Make&& make) noexcept {
    static_assert(sizeof...(Types) > 0, "name the types to copy");
    static_assert((std::is_base_of_v<std::exception, Types> && ...),
                  "the types are exceptions (derived from std::exception)");
    if (e == nullptr) return e;
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        try {
            std::exception_ptr out;
            if ((copy_if_exactly<Types>(x, make, out) || ...)) return out;
        } catch (...) {  // no memory for the copy: share the original
        }
        return e;
    } catch (...) {
        return e;
    }
}

}  // namespace delayq::detail
