// A stand-in for PyTorch's c10/util/Exception.h, just enough to compile sympool's torch shim
// (python/sympool/_torch_shim.cpp) without torch: c10::Error, c10::OutOfMemoryError and the two
// macros the shim uses, with the same shape as PyTorch's (variadic message parts, the error type
// named without its namespace in TORCH_CHECK_WITH). The real header is used where torch is.
#ifndef SP_TEST_C10_EXCEPTION_H
#define SP_TEST_C10_EXCEPTION_H

#include <sstream>
#include <stdexcept>
#include <string>

namespace c10 {
class Error : public std::runtime_error {
  public:
    explicit Error(const std::string &msg) : std::runtime_error(msg) {}
};
class OutOfMemoryError : public Error {
    using Error::Error;
};
template <typename... Args> std::string str(const Args &...args) {
    std::ostringstream o;
    (o << ... << args);
    return o.str();
}
} // namespace c10

#define TORCH_CHECK_WITH(error_t, cond, ...)                                                       \
    if (!(cond))                                                                                   \
    throw ::c10::error_t(::c10::str(__VA_ARGS__))
#define TORCH_CHECK(cond, ...) TORCH_CHECK_WITH(Error, cond, __VA_ARGS__)

#endif
