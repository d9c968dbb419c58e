// FiberContext (fiber_context.h).
#include "tests/model/cuda/fiber_context.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
// txl_emu_switch(void** save_sp, void* load_sp): pushes the System V ABI's
// callee-saved registers and the SSE and x87 control words on the running
// stack, stores that stack's pointer in *save_sp, loads load_sp and pops the
// same from there, returning where that stack was saved (or, for a new
// fiber, into its entry: MakeFiberContext lays out such a frame). Both
// stacks hold the same layout at the switch, so the unwind notes stay true
// across it. No shadow stack: the file is built with -fcf-protection=none
// (a `ret` onto another stack is what a shadow stack forbids).
extern "C" void txl_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl txl_emu_switch
  .type txl_emu_switch, @function
txl_emu_switch:
  .cfi_startproc
  pushq %rbp
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %rbp, 0
  pushq %rbx
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %rbx, 0
  pushq %r12
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %r12, 0
  pushq %r13
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %r13, 0
  pushq %r14
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %r14, 0
  pushq %r15
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %r15, 0
  subq $8, %rsp
  .cfi_adjust_cfa_offset 8
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  .cfi_adjust_cfa_offset -8
  popq %r15
  .cfi_adjust_cfa_offset -8
  .cfi_restore %r15
  popq %r14
  .cfi_adjust_cfa_offset -8
  .cfi_restore %r14
  popq %r13
  .cfi_adjust_cfa_offset -8
  .cfi_restore %r13
  popq %r12
  .cfi_adjust_cfa_offset -8
  .cfi_restore %r12
  popq %rbx
  .cfi_adjust_cfa_offset -8
  .cfi_restore %rbx
  popq %rbp
  .cfi_adjust_cfa_offset -8
  .cfi_restore %rbp
  ret
  .cfi_endproc
  .size txl_emu_switch, .-txl_emu_switch
)");
#endif

namespace txl_emu {

#if defined(__x86_64__)

void MakeFiberContext(FiberContext* context, char* stack, size_t bytes, void (*entry)()) {
  // From the top, 16-byte aligned: a null return address for the entry
  // (which never returns), so that it starts with its stack as after a call
  // (8 past a multiple of 16); the entry, which txl_emu_switch's `ret`
  // takes; six callee-saved registers (zero); the running control words.
  const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t{15};
  uint64_t* frame = reinterpret_cast<uint64_t*>(top) - 9;
  std::memset(frame, 0, 9 * sizeof(uint64_t));
  frame[7] = reinterpret_cast<uint64_t>(entry);
  uint32_t mxcsr = 0;
  uint16_t x87 = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(x87));
  std::memcpy(frame, &mxcsr, sizeof mxcsr);
  std::memcpy(reinterpret_cast<char*>(frame) + 4, &x87, sizeof x87);
  context->sp = frame;
}

void SwitchFiberContext(FiberContext* from, FiberContext* to) { txl_emu_switch(&from->sp, to->sp); }

#else

void MakeFiberContext(FiberContext* context, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&context->uc);
  context->uc.uc_stack.ss_sp = stack;
  context->uc.uc_stack.ss_size = bytes;
  context->uc.uc_link = nullptr;
  makecontext(&context->uc, entry, 0);
  // ASan's swapcontext unpoisons the stack a context names on every
  // switch, which would hide an overrun of a kernel's locals: the caller's
  // fiber annotations tell it the stacks instead.
  context->uc.uc_stack = stack_t{};
}

void SwitchFiberContext(FiberContext* from, FiberContext* to) { swapcontext(&from->uc, &to->uc); }

#endif

}  // namespace txl_emu
