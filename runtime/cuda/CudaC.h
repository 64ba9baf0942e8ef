/*===- CudaC.h - The CUDA runtime's C interface --------------------*- C -*-===//
 *
 * What python/cellc/cuda.py calls through ctypes, so that a GPU machine runs
 * packages without an extension built for its Python: a package read once
 * (kernels.json, in C++), its kernels loaded on a GPU or in the SIMT
 * emulator, and one call per forward and one per backward. Nothing here
 * calls back into the caller. Every function that can fail returns 0 on
 * success and writes the reason into `error` otherwise.
 *
 *===----------------------------------------------------------------------===*/

#ifndef CELLC_RUNTIME_CUDA_CUDAC_H
#define CELLC_RUNTIME_CUDA_CUDAC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor: contiguous, row-major, on the device (on the host for the
 * emulator). `data` null: none given. Elements (cellc::driver::Element): 0
 * f32, 1 f64, 2 bf16, 3 u8, 4 i32. An index argument of a raw launch is a
 * tensor of rank -1 whose shape[0] is the value. */
typedef struct cellc_tensor {
  void *data;
  int64_t shape[4];
  int32_t rank;
  int32_t element;
} cellc_tensor;

typedef struct cellc_tensors {
  const cellc_tensor *items;
  int64_t count;
} cellc_tensors;

/* One forward or backward. The lists follow the cell's slots in order.
 * Forward: inputs, params, initial states (count 0, or a tensor without
 * data: zeros), resets (none: without data), lengths (num_lengths 0:
 * none), outputs and final states; a training forward keeps into `kept`
 * (cellc_cuda_kept_layout's buffers). Backward: the same, with the kept
 * buffers and the outputs a training forward keeps as states' histories
 * (the others may be without data), the gradients of the outputs and final
 * states (without data: zeros), and those wanted of the inputs, params and
 * initial states (without data: not wanted). `workspace` of
 * `workspace_bytes` on the device, for the call's buffers; `stream` a
 * CUstream (null: the default stream; ignored by the emulator). */
typedef struct cellc_call {
  const char *mode;
  int64_t steps, batch;
  cellc_tensors inputs, params, initial;
  cellc_tensor resets;
  const int64_t *lengths;
  int64_t num_lengths;
  cellc_tensors outputs, finals, kept;
  int32_t training;
  cellc_tensors grad_outputs, grad_finals, grad_inputs, grad_params, grad_initial;
  void *workspace;
  int64_t workspace_bytes;
  void *stream;
  /* Set by the call: the workspace it needs. */
  int64_t needed;
} cellc_call;

/* What cellc_cuda_forward and _backward return besides 0 and 1: the
 * workspace given is smaller than `needed`, and nothing ran. */
#define CELLC_WORKSPACE_TOO_SMALL 2

/* The chunk form's cores (runtime/cuda/ChunkKernels.cu), f32, on
 * time-major arrays as runtime/cpu/ChunkCore.h takes them, with the reads
 * stacked: q [reads, T, BH, K], out and dout [reads, T, BH, V], pairs
 * [BH, NC, reads, L, L]. Opened on a GPU (`device` >= 0: the PTX the
 * runtime carries) or in the SIMT emulator (`device` -1: `simt_object`,
 * which cellc._cellc.chunk_kernels_simt writes from the same IR). The
 * backwards take dout and dEnd whole (zeros where no gradient came). The
 * diagonal template: cellc_cuda_chunk_forward and _backward; the delta
 * rule with a scalar gate: cellc_cuda_delta_forward and _backward, with a
 * and beta [T, BH] and the targets w [T, BH, V].
 * cellc_cuda_chunk_admit says whether the device launches both kernels of
 * a template (`delta` 0 or 1) at the shape, as the driver (or the
 * emulator's device model) answers for their block and shared memory,
 * which grows as K V + L (K + V) + L^2. */
typedef struct cellc_chunk_shape {
  int64_t BH, T;
  int32_t K, V, L, reads;
  /* 1: the kernels' products on the tensor cores (3xTF32) where K and L
   * are multiples of 16 and V of 8; 0: on FMAs. */
  int32_t tensor_cores;
} cellc_chunk_shape;

void *cellc_cuda_chunk_open(int32_t device, const char *simt_object, uint64_t shuffle_seed,
                            char *error, size_t size);
void cellc_cuda_chunk_free(void *kernels);
/* The PTX the runtime loads on a GPU. */
const char *cellc_cuda_chunk_ptx(void);
int cellc_cuda_chunk_admit(void *kernels, const cellc_chunk_shape *shape, int32_t delta,
                           char *error, size_t size);
int cellc_cuda_chunk_forward(void *kernels, const cellc_chunk_shape *shape, const float *a,
                             const float *k, const float *v, const float *S0, const float *q,
                             float *out, float *starts, float *end, float *pairs,
                             void *stream, char *error, size_t size);
int cellc_cuda_chunk_backward(void *kernels, const cellc_chunk_shape *shape, const float *a,
                              const float *k, const float *v, const float *starts,
                              const float *end, const float *pairs, const float *q,
                              const float *dout, const float *dEnd, float *da, float *dk,
                              float *dv, float *dS0, float *dq, void *stream, char *error,
                              size_t size);
int cellc_cuda_delta_forward(void *kernels, const cellc_chunk_shape *shape, const float *a,
                             const float *k, const float *w, const float *beta,
                             const float *S0, const float *q, float *out, float *starts,
                             float *end, void *stream, char *error, size_t size);
int cellc_cuda_delta_backward(void *kernels, const cellc_chunk_shape *shape, const float *a,
                              const float *k, const float *w, const float *beta,
                              const float *starts, const float *end, const float *q,
                              const float *dout, const float *dEnd, float *da, float *dk,
                              float *dw, float *dbeta, float *dS0, float *dq, void *stream,
                              char *error, size_t size);

/* Whether a CUDA driver and a device are there: 1, or 0 with why. */
int cellc_cuda_available(char *error, size_t size);

/* A package directory, read (kernels.json) and checked. */
void *cellc_cuda_package_open(const char *directory, char *error, size_t size);
void cellc_cuda_package_free(void *package);
/* What it holds, as JSON text (free it with cellc_cuda_free_text): cell,
 * arch, precision, strategy, storage, mma_sites, sizes, slots, state_dims,
 * ptx, simt and each kernel's launch and arguments. */
char *cellc_cuda_package_describe(void *package);
void cellc_cuda_free_text(char *text);

/* The package's kernels on GPU `device`, or (device -1) in the SIMT
 * emulator, with `shuffle_seed` (nonzero) shuffling its threads. */
void *cellc_cuda_cell_open(void *package, int32_t device, uint64_t shuffle_seed, char *error,
                           size_t size);
void cellc_cuda_cell_free(void *cell);

int cellc_cuda_forward(void *cell, cellc_call *call, char *error, size_t size);
int cellc_cuda_backward(void *cell, cellc_call *call, char *error, size_t size);

/* The buffers a training forward in `mode` keeps, each as `layout[3 i ..
 * 3 i + 2]` = per chunk (leading dimension the chunks, else T; then B and
 * the width), width and element, for at most `capacity`, their count in
 * `count`; and the outputs it keeps as states' histories into
 * `outputs_read` (at most `read_capacity`), their count in `num_read`. */
int cellc_cuda_kept_layout(void *cell, const char *mode, int32_t has_lengths, int64_t *layout,
                           int64_t capacity, int64_t *count, int64_t *outputs_read,
                           int64_t read_capacity, int64_t *num_read, char *error,
                           size_t size);

/* What a training step of `steps` x `batch` in `mode` holds on the device
 * (driver::MemoryPlan) into out[12]: kept, forward peak, backward peak (the
 * driver's: kept and a call's workspace), outputs, final states, output
 * gradients, input gradients, param gradients, kept outputs, piece steps,
 * the peak over the step and its floor. */
int cellc_cuda_plan(void *cell, const char *mode, int64_t steps, int64_t batch, int64_t *out,
                    char *error, size_t size);

/* The driver's figures of the last calls into out[6]: kept, forward peak,
 * backward peak, live (driver::MemoryStats), then the workspace the last
 * forward and the last backward used. */
void cellc_cuda_memory_stats(void *cell, int64_t *out);

/* Launches the package's forward (or backward) kernel, the variant that
 * saves gates or the one that replays, on `args` alone (in the kernel's
 * order), over `batch` rows, on `stream`: for tests of what the emulator
 * catches. */
int cellc_cuda_launch(void *cell, int32_t backward, int32_t save_gates,
                      const cellc_tensor *args, int64_t num_args, int64_t batch, void *stream,
                      char *error, size_t size);

/* The launch of the package's forward (or backward) kernel over `batch`
 * rows, as a call makes it, into out[6]: grid x, grid y, threads per CTA,
 * dynamic shared bytes, cooperative (1 or 0) and the CTAs per SM the device
 * keeps resident; an error, in the driver's words, where the device would
 * refuse it (the emulator: under its device model). Nothing runs. */
int cellc_cuda_launch_plan(void *cell, int32_t backward, int32_t save_gates, int64_t batch,
                           int64_t *out, char *error, size_t size);

/* What the device was asked since the last reset (`reset` nonzero: reset
 * now), by kind, as JSON text (free it with cellc_cuda_free_text): the
 * SIMT emulator counts every launch, GEMM, copy, memset and runtime kernel;
 * a GPU counts nothing ({}). */
char *cellc_cuda_device_calls(void *cell, int32_t reset);

/* Registers per thread of `kernel` in a variant, from the driver (GPU). */
int cellc_cuda_registers(void *cell, const char *kernel, int32_t save_gates,
                         int32_t *registers, char *error, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* CELLC_RUNTIME_CUDA_CUDAC_H */
