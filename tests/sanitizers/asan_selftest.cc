// Proves the ASan + UBSan build (TXL_SANITIZE=address) catches what it should:
// each mode but "clean" has a bug the sanitizers must turn into a failing exit
// (CTest expects those runs to fail; "clean" must pass).
//   asan_selftest heap-overflow | use-after-free | signed-overflow | leak |
//                 fiber-use-after-return | clean
// fiber-use-after-return: a frame of a thread on the block emulator's fibers
// (tests/model/cuda/block_emulator.h) read after it returned, in the last of
// 2,048 blocks run in order, on the fake stacks the fibers keep from block
// to block: a frame that never returned in each block before would have
// used up its size of fake frames by then, and ASan would have put the
// frame on the real stack, unreported (built with use-after-return
// detection always on: tests/CMakeLists.txt).
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/model/cuda/block_emulator.h"

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

// The address of a local of a frame that is gone when the caller has it
// (through a volatile, not Launder: ASan puts no frame with inline assembly
// on its fake stack).
const int* volatile escaped = nullptr;
__attribute__((noinline)) const int* AddressOfALocal() {
  int local[4] = {1, 2, 3, 4};
  escaped = local;
  return escaped;
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
  if (std::strcmp(mode, "fiber-use-after-return") == 0) {
    constexpr unsigned kBlocks = 2048;
    int sum = 0;
    txl_emu::SetOrderSeed(0);
    txl_emu::Launch(txl_emu::Dim3(kBlocks), txl_emu::Dim3(32), 0, [&sum] {
      const int* p = AddressOfALocal();
      if (txl_emu::BlockIndex().x == kBlocks - 1 && txl_emu::ThreadIndex().x == 0) sum += *p;
    });
    std::printf("%d\n", sum);
    return 0;
  }
  if (std::strcmp(mode, "clean") == 0) {
    std::vector<int> v(4, 1);
    return v[Launder(3)] == 1 ? 0 : 1;
  }
  std::fprintf(stderr, "usage: %s heap-overflow|use-after-free|signed-overflow|leak|fiber-use-after-return|clean\n",
               argv[0]);
  return 2;
}
