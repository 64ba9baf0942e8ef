//===- ChunkKernels.cu - The chunk form's cores as CUDA kernels ----------===//
//
// What runtime/cpu/ChunkCore does, on a GPU: the chunkwise form's two
// kernel templates, forward and their written-out adjoints, in f32, each on
// FMAs and on the tensor cores (ChunkCuda.cpp chooses).
//   - The diagonal core (ChunkDiagonal.cuh): scalar or row gates,
//     outer-product sources, reads after the update (GLA, RetNet, mLSTM).
//   - The delta rule with a scalar gate (ChunkDelta.cuh: DeltaNet, gated
//     DeltaNet).
//
// The arrays are those of the CPU core, time-major: a, k and the reads' q
// stacked as [R, T, BH, K]; v [T, BH, V], the reads' outputs stacked as
// [R, T, BH, V]; the states [BH, K, V]; `starts` [BH, NC, K, V]; `pairs`
// [BH, NC, R, L, L] (the pair weights q_t (e^{A_t - A_s} k_s) for s <= t,
// zero above the diagonal). A scalar gate comes spread over K; the delta
// rule's a and beta are [T, BH].
//
// The forwards take a CTA per (sample and head, tile of BV columns of the
// state): the columns of both templates' states are independent. A CTA
// holds its state tile in shared memory and runs the chunks in order. The
// backwards take a CTA per sample and head and run the chunks in reverse
// with the state's gradient in shared memory. Every exponent taken is <= 0
// where the gates are <= 1.
//
// This file is clang CUDA with no CUDA headers (scripts/gen-chunk-kernels.sh
// compiles it): one LLVM IR for the NVPTX backend (the PTX the runtime
// loads) and for the SIMT emulator (compileSimtObject), so that what the
// emulator checks is what a GPU runs. The exponential is written out (no
// libdevice), the same on both.
//
//===----------------------------------------------------------------------===//

// One translation unit, so that one PTX module and one emulated object hold
// every kernel: what they share, then each template's.
#include "ChunkDevice.cuh"

#include "ChunkDiagonal.cuh"

#include "ChunkDelta.cuh"
