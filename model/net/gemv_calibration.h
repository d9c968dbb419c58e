// How far ahead one session's products fetch bfloat16 and int8 rows
// (WeightMatrix::ahead), chosen at load by timing them: the distance that
// helped most on one CPU (16 rows on the AMD EPYC, OPTIMISATIONS step 16)
// need not on another, and no table of microarchitectures can be measured
// from here.
#ifndef TXL_MODEL_NET_GEMV_CALIBRATION_H_
#define TXL_MODEL_NET_GEMV_CALIBRATION_H_

#include <cstdint>
#include <vector>

#include "model/kernels/decode_kernels.h"

namespace txl {

// A matrix as GemvRows reads it.
struct GemvMatrix {
  WeightMatrix w;
  int64_t rows = 0, cols = 0;
};

struct GemvCalibrationConfig {
  std::vector<int64_t> candidates = {0, 8, 16, 32};  // rows ahead
  int rounds = 3;                                    // each candidate's passes; the best counts
  // A pass reads the matrices in order until this many bytes: enough to
  // come from memory rather than cache, few enough that the calibration
  // stays well under 100 ms.
  int64_t pass_bytes = int64_t{96} << 20;
};

struct GemvCalibration {
  int64_t ahead = 0;            // the candidate with the fastest pass
  std::vector<double> seconds;  // per candidate: its best pass
  double total_seconds = 0;     // the calibration's own time
};

// Times passes of one session's products over `matrices` (each thread its
// share of every matrix's rows, as a decode step splits them) with each
// candidate, interleaved round by round.
GemvCalibration CalibrateGemvAhead(const std::vector<GemvMatrix>& matrices, KernelIsa isa,
                                   const GemvCalibrationConfig& config = {});

}  // namespace txl

#endif  // TXL_MODEL_NET_GEMV_CALIBRATION_H_
