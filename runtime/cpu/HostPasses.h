//===- HostPasses.h - Passes over views in host memory ----------*- C++ -*-===//
//
// What a backend whose buffers are host memory (the CPU's, the SIMT
// emulator's) does besides kernels and GEMMs, each one pass over its views:
// with per-sample lengths, the rows past a sample's length zeroed, each
// sample's row at its last step gathered, a row added where a sample ends;
// and a param transposed. f32, f64 and bf16 (rounded as the GPU rounds it),
// so that both host backends share one loop each.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CPU_HOSTLENGTHS_H
#define CELLC_RUNTIME_CPU_HOSTLENGTHS_H

#include "runtime/driver/SequenceDriver.h"

#include <cstdint>

namespace cellc::runtime {

/// bf16 as the GPU converts it (cvt.rn.bf16.f32: to nearest even, NaN stays
/// NaN), and back, exactly.
uint16_t toBf16(float value);
float fromBf16(uint16_t value);
/// Element `i` of `p` (f32, f64 or bf16) as a double, and stored from one.
double loadElement(const void *p, driver::Element e, int64_t i);
void storeElement(void *p, driver::Element e, int64_t i, double v);

/// driver::Backend::transpose on host views.
driver::Status transpose(const driver::View &from, const driver::View &to);

/// The three passes of driver::Backend (maskPastLengths, gatherAtLengths,
/// addAtLengths) on host views, with `lengths` [B] int32 on the host.
void maskPastLengths(const driver::View &v, const int32_t *lengths, int64_t first);
driver::Status gatherAtLengths(const driver::View &from, int64_t t0, const int32_t *lengths,
                               const driver::View &to);
driver::Status addAtLengths(const driver::View &from, const int32_t *lengths, int64_t step,
                            const driver::View &to);

} // namespace cellc::runtime

#endif // CELLC_RUNTIME_CPU_HOSTLENGTHS_H
