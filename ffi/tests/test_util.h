#pragma once
// A tiny self-contained test harness: TEST(name) registers a function; CHECK* record failures.

#include <cstdint>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "config.h"

namespace jaxoff::aio::testing {

struct TestCase {
  const char* name;
  std::function<void()> fn;
};

std::vector<TestCase>& Registry();
int& FailureCount();
// Tests that skipped themselves (SKIP_TEST). A binary whose every test skipped exits with 77,
// which CTest reports as skipped where the test sets SKIP_RETURN_CODE 77.
int& SkipCount();
// Backend selected on the command line (--backend posix|io_uring|auto).
BackendKind& SelectedBackend();
// A fresh temporary directory for the running test (removed at exit).
std::string TempDir();
// Deterministic pseudo-random bytes.
std::vector<char> RandomBytes(size_t n, uint32_t seed);

struct Registrar {
  Registrar(const char* name, std::function<void()> fn) { Registry().push_back({name, fn}); }
};

}  // namespace jaxoff::aio::testing

#define JAXOFF_CAT2(a, b) a##b
#define JAXOFF_CAT(a, b) JAXOFF_CAT2(a, b)
#define TEST(name)                                                                         \
  static void name();                                                                      \
  static ::jaxoff::aio::testing::Registrar JAXOFF_CAT(registrar_, name)(#name, name);     \
  static void name()

// Ends the running test as skipped, saying why (e.g. no device on this machine).
#define SKIP_TEST(why)                                                                     \
  do {                                                                                     \
    ++::jaxoff::aio::testing::SkipCount();                                                 \
    std::cout << "skipped: " << (why) << std::endl;                                        \
    return;                                                                                \
  } while (0)

#define CHECK(cond)                                                                        \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      ++::jaxoff::aio::testing::FailureCount();                                            \
      std::cerr << __FILE__ << ":" << __LINE__ << ": CHECK failed: " #cond << std::endl;   \
    }                                                                                      \
  } while (0)

#define CHECK_EQ(a, b)                                                                     \
  do {                                                                                     \
    auto _va = (a);                                                                        \
    auto _vb = (b);                                                                        \
    if (!(_va == _vb)) {                                                                   \
      ++::jaxoff::aio::testing::FailureCount();                                            \
      std::cerr << __FILE__ << ":" << __LINE__ << ": CHECK_EQ failed: " #a " == " #b " ("  \
                << _va << " vs " << _vb << ")" << std::endl;                               \
    }                                                                                      \
  } while (0)

#define CHECK_CONTAINS(haystack, needle)                                                   \
  do {                                                                                     \
    std::string _h = (haystack);                                                           \
    if (_h.find(needle) == std::string::npos) {                                            \
      ++::jaxoff::aio::testing::FailureCount();                                            \
      std::cerr << __FILE__ << ":" << __LINE__ << ": '" << needle << "' not in: " << _h   \
                << std::endl;                                                              \
    }                                                                                      \
  } while (0)
