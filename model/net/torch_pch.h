// Precompiled header for the torch translation units of model/ (build time).
#include <ATen/ATen.h>
#include <torch/script.h>
