// The block emulator's switch between fibers (block_emulator.cc): on x86-64
// a few instructions that swap the callee-saved registers and the stack,
// where ucontext's swapcontext and getcontext each made a system call (to
// save the signal mask) and took most of a kernel's emulated time. The
// sanitizers' fiber annotations stay the caller's. Elsewhere, ucontext.
#ifndef TXL_TESTS_MODEL_CUDA_FIBER_CONTEXT_H_
#define TXL_TESTS_MODEL_CUDA_FIBER_CONTEXT_H_

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace txl_emu {

// A suspended fiber (or the scheduler while a fiber runs).
struct FiberContext {
#if defined(__x86_64__)
  void* sp = nullptr;  // its stack, where its registers were saved
#else
  ucontext_t uc;
#endif
};

// Makes `context` start `entry` on the stack [stack, stack + bytes) when it
// is first switched to. `entry` must never return: it switches away last.
void MakeFiberContext(FiberContext* context, char* stack, size_t bytes, void (*entry)());

// Saves the running code in `from` and resumes `to`; returns when something
// switches back to `from`.
void SwitchFiberContext(FiberContext* from, FiberContext* to);

}  // namespace txl_emu

#endif  // TXL_TESTS_MODEL_CUDA_FIBER_CONTEXT_H_
