// Runs every registered test:
//   jaxoff_engine_tests [--backend posix|io_uring|auto] [--fail-fast] [filter]
// --fail-fast stops after the first test with a failed check (the pager's mutant builds: one
// failure is the verdict). Exit status: 0 all passed, 1 a check failed (or nothing ran), 77
// every test that ran skipped itself.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "backend.h"
#include "test_util.h"

namespace jaxoff::aio::testing {

std::vector<TestCase>& Registry() {
  static std::vector<TestCase> r;
  return r;
}
int& FailureCount() {
  static int n = 0;
  return n;
}
int& SkipCount() {
  static int n = 0;
  return n;
}
BackendKind& SelectedBackend() {
  static BackendKind k = BackendKind::kAuto;
  return k;
}

namespace {
std::string g_root;
int g_counter = 0;
}  // namespace

std::string TempDir() {
  std::string d = g_root + "/t" + std::to_string(g_counter++);
  std::filesystem::create_directories(d);
  return d;
}

std::vector<char> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<char> v(n);
  for (auto& c : v) c = static_cast<char>(rng());
  return v;
}

}  // namespace jaxoff::aio::testing

int main(int argc, char** argv) {
  using namespace jaxoff::aio;
  using namespace jaxoff::aio::testing;
  std::string filter;
  bool fail_fast = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      SelectedBackend() = ParseBackend(argv[++i]);
    } else if (std::strcmp(argv[i], "--fail-fast") == 0) {
      fail_fast = true;
    } else {
      filter = argv[i];
    }
  }
  if (SelectedBackend() == BackendKind::kIoUring && !UringCompiledIn()) {
    std::cout << "io_uring not compiled in: skipped" << std::endl;
    return 0;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp ? tmp : "/tmp") + "/jaxoff_engine_test.XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    std::perror("mkdtemp");
    return 2;
  }
  g_root = buf.data();
  int ran = 0;
  for (const auto& t : Registry()) {
    if (!filter.empty() && std::string(t.name).find(filter) == std::string::npos) continue;
    const int before = FailureCount();
    const int skipped_before = SkipCount();
    try {
      t.fn();
    } catch (const std::exception& e) {
      ++FailureCount();
      std::cerr << t.name << ": unexpected exception: " << e.what() << std::endl;
    }
    const char* verdict = FailureCount() != before       ? "[ FAIL ] "
                          : SkipCount() != skipped_before ? "[ SKIP ] "
                                                          : "[ OK   ] ";
    std::cout << verdict << t.name << " (" << BackendName(SelectedBackend()) << ")"
              << std::endl;
    ++ran;
    if (fail_fast && FailureCount() != 0) break;
  }
  std::filesystem::remove_all(g_root);
  std::cout << ran << " tests, " << FailureCount() << " failed checks, " << SkipCount()
            << " skipped" << std::endl;
  if (FailureCount() == 0 && ran > 0 && SkipCount() == ran) return 77;
  return FailureCount() == 0 && ran > 0 ? 0 : 1;
}
