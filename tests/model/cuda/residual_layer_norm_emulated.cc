// model/cuda/residual_layer_norm.cu compiled as C++ against the emulated
// CUDA runtime (include/cuda_runtime.h): QueueResidualLayerNorm runs the
// kernel on block_emulator.h, over host memory.
#include "model/cuda/residual_layer_norm.cu"
