// The two constructs of our kernels that are CUDA syntax rather than C++, as
// macros: a launch, and a block's dynamic shared memory. Under nvcc they are
// CUDA's own. tests/model/cuda/ defines them first (its cuda_runtime.h) to
// compile the same kernel sources as C++ and run each block's threads as
// fibers on the CPU (block_emulator.h).
#ifndef TXL_MODEL_CUDA_KERNEL_SYNTAX_H_
#define TXL_MODEL_CUDA_KERNEL_SYNTAX_H_

#ifndef TXL_LAUNCH_KERNEL
// TXL_LAUNCH_KERNEL(grid, block, shared_bytes, stream, kernel)(arguments...);
// the kernel last, so that a template's commas need no parentheses.
#define TXL_LAUNCH_KERNEL(grid, block, shared_bytes, stream, ...) __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
// TXL_DYNAMIC_SHARED(type, name): `name`, the launch's shared_bytes as `type`s.
#define TXL_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

#endif  // TXL_MODEL_CUDA_KERNEL_SYNTAX_H_
