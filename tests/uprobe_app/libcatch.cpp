/* A C++ library a C program opens RTLD_LOCAL (as Python opens an extension module): it throws and catches. */
#include <stdexcept>

extern "C" int catch_one(int x) {
    try {
        if (x) throw std::runtime_error("caught inside");
    } catch (const std::exception &) {
        return 7;
    }
    return 0;
}
