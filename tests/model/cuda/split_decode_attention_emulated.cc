// model/cuda/split_decode_attention.cu compiled as C++ against the emulated
// CUDA runtime (include/cuda_runtime.h): QueueSplitDecodeAttention runs the
// kernel on block_emulator.h, over host memory.
#include "model/cuda/split_decode_attention.cu"
