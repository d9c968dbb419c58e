// Proves the ASan + UBSan build (TXL_SANITIZE=address) catches what it should:
// each mode but "clean" has a bug the sanitizers must turn into a failing exit
// (CTest expects those runs to fail; "clean" must pass).
//   asan_selftest heap-overflow | use-after-free | signed-overflow | leak | clean
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace {

// Opaque to the optimiser, so the bugs below are not folded away.
template <typename T>
T Launder(T v) {
  asm volatile("" : "+r"(v));
  return v;
}

// Allocates and drops the only pointers, in a frame that is gone before the
// leak check scans the stack.
__attribute__((noinline)) void Leak() {
  for (int i = 0; i < 8; ++i) Launder(std::malloc(64));
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc == 2 ? argv[1] : "";
  if (std::strcmp(mode, "heap-overflow") == 0) {
    std::unique_ptr<int[]> a(new int[4]);
    return a[Launder(4)];
  }
  if (std::strcmp(mode, "use-after-free") == 0) {
    int* p = new int(3);
    delete Launder(p);
    return *p;
  }
  if (std::strcmp(mode, "signed-overflow") == 0) {
    const int x = Launder(INT_MAX);
    std::printf("%d\n", x + 1);
    return 0;
  }
  if (std::strcmp(mode, "leak") == 0) {
    Leak();
    return 0;
  }
  if (std::strcmp(mode, "clean") == 0) {
    std::vector<int> v(4, 1);
    return v[Launder(3)] == 1 ? 0 : 1;
  }
  std::fprintf(stderr, "usage: %s heap-overflow|use-after-free|signed-overflow|leak|clean\n", argv[0]);
  return 2;
}
