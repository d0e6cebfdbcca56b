/* A C++ library a C program opens RTLD_LOCAL (as Python opens an extension module): it throws and catches, and
 * rethrows inside the catch, which only the C++ runtime that began that catch can (built twice by the tests: one
 * copy linked with -static-libstdc++, which then exports a runtime of its own). */
#include <stdexcept>

extern "C" int catch_one(int x) {
    try {
        if (x) throw std::runtime_error("caught inside");
    } catch (...) {
        try {
            throw;
        } catch (const std::exception &) {
            return 7;
        }
    }
    return 0;
}
