// model/cuda/skinny_product.cu compiled as C++ against the emulated CUDA
// runtime (include/cuda_runtime.h): QueueSkinnyProduct runs the kernel on
// block_emulator.h, over host memory.
#include "model/cuda/skinny_product.cu"
