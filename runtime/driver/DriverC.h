/*===- DriverC.h - The sequence driver's C interface --------------*- C -*-===//
 *
 * The sequence driver for callers outside C++ (python/cellc/cuda.py, through
 * ctypes): a cell's interface is built argument by argument from its
 * package's kernels.json, and the backend is a table of callbacks. Every
 * function that can fail returns 0 on success and writes the reason into
 * `error` otherwise. Views name a backend buffer by its id.
 *
 *===----------------------------------------------------------------------===*/

#ifndef CELLC_RUNTIME_DRIVER_DRIVERC_H
#define CELLC_RUNTIME_DRIVER_DRIVERC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Elements of a buffer (cellc::driver::Element): 0 f32, 1 f64, 2 bf16, 3 u8,
 * 4 i32. */
typedef struct cellc_view {
  int64_t buffer; /* the backend's id; -1: none */
  int64_t offset; /* in elements */
  int32_t element;
  int32_t rank;
  int64_t shape[4];
} cellc_view;

typedef struct cellc_arg {
  int32_t is_index;
  int64_t index;
  cellc_view view;
} cellc_arg;

/* What the driver asks of the caller; each returns 0 on success. */
typedef struct cellc_callbacks {
  int (*allocate)(int64_t elements, int32_t element, int32_t zero, int64_t *id);
  void (*release)(int64_t id);
  int (*launch)(int32_t backward, int32_t save_gates, int32_t nargs,
                const cellc_arg *args, int64_t batch);
  int (*gemm)(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
              const cellc_view *a, int64_t lda, const cellc_view *b, int64_t ldb,
              double beta, const cellc_view *c, int64_t ldc);
  int (*column_sums)(const cellc_view *m, int64_t rows, int64_t cols,
                     const cellc_view *acc);
  int (*fill_rows)(const cellc_view *m, int64_t rows, int64_t cols, int32_t n,
                   const cellc_view *vectors);
  int (*copy)(const cellc_view *from, const cellc_view *to);
  int (*add)(const cellc_view *from, const cellc_view *to);
} cellc_callbacks;

/* The element code of an MLIR element type's name ("f32", "bf16", ...), or -1. */
int32_t cellc_element(const char *name);

/* A cell's interface: its kernels' arguments in order (kind and element are
 * the words of kernels.json; biases comma-separated; element "" for an
 * index), then each kernel's tile and workspace. */
void *cellc_interface_new(const char *compute);
int cellc_interface_arg(void *interface, int32_t backward, const char *kind,
                        const char *name, const char *input, const char *biases,
                        int64_t same_as, int32_t zero, const char *element,
                        int32_t rank, const int64_t *shape, char *error,
                        size_t size);
void cellc_interface_kernel(void *interface, int32_t backward, int64_t batch_tile,
                            int64_t workspace_bytes);
void cellc_interface_free(void *interface);

/* A driver over `interface` (which it copies) and `callbacks` (which must
 * outlive it). */
void *cellc_driver_new(void *interface, const cellc_callbacks *callbacks,
                       char *error, size_t size);
void cellc_driver_free(void *driver);

/* The sequence's inputs, params and initial states (buffer -1: zeros) in
 * declaration order, resets (buffer -1: none), `num_lengths` per-sample
 * lengths on the host (0: none; driver::Sequence::lengths). With `saved`,
 * forward keeps what backward needs in `mode` ("none", "full", "chunk:K");
 * backward takes the same lengths. With `outputs_outlive_saved`, the caller
 * keeps the output buffers (their ids) alive and unchanged as long as
 * `saved`, and an output that is a state is that state's history in it
 * (cellc_saved_outputs_read says which). */
int cellc_driver_forward(void *driver, const char *mode, int64_t steps,
                         int64_t batch, const cellc_view *inputs,
                         const cellc_view *params, const cellc_view *initial,
                         const cellc_view *resets, const int64_t *lengths,
                         int64_t num_lengths, const cellc_view *outputs,
                         const cellc_view *finals, void **saved,
                         int32_t outputs_outlive_saved, char *error, size_t size);
int cellc_driver_backward(void *driver, void *saved, const cellc_view *inputs,
                          const cellc_view *params, const cellc_view *initial,
                          const cellc_view *resets, const int64_t *lengths,
                          int64_t num_lengths, const cellc_view *grad_outputs,
                          const cellc_view *grad_finals, const cellc_view *grad_inputs,
                          const cellc_view *grad_params,
                          const cellc_view *grad_initial, char *error, size_t size);
/* For a caller that holds what a training forward keeps (a torch operator):
 * the buffers that forward in `mode` keeps (driver::KeptBuffer, with the
 * outputs outliving the Saved), each as `layout[3 i .. 3 i + 2]` = per chunk
 * (leading dimension: the chunks, else T; then B and the width), width and
 * element, for at most `capacity` of them, their count in `count`; and the
 * outputs kept as states' histories, into `outputs_read` (room for every
 * output), their count in `num_read`. */
int cellc_driver_kept_layout(void *driver, const char *mode, int32_t has_lengths,
                             int64_t *layout, int64_t capacity, int64_t *count,
                             int64_t *outputs_read, int64_t *num_read, char *error,
                             size_t size);
/* A training forward that keeps into the caller's `kept` buffers (in that
 * layout); the caller keeps them and the outputs unchanged until the
 * backward, whose Saved cellc_driver_adopt makes from them. */
int cellc_driver_forward_kept(void *driver, const char *mode, int64_t steps,
                              int64_t batch, const cellc_view *inputs,
                              const cellc_view *params, const cellc_view *initial,
                              const cellc_view *resets, const int64_t *lengths,
                              int64_t num_lengths, const cellc_view *outputs,
                              const cellc_view *finals, const cellc_view *kept,
                              int64_t num_kept, char *error, size_t size);
/* The Saved of such a forward, for cellc_driver_backward (free it with
 * cellc_saved_free). Outputs it does not read may be buffer -1. */
int cellc_driver_adopt(void *driver, const char *mode, int64_t steps, int64_t batch,
                       const cellc_view *inputs, const cellc_view *params,
                       const cellc_view *initial, const cellc_view *resets,
                       const int64_t *lengths, int64_t num_lengths,
                       const cellc_view *outputs, const cellc_view *kept, int64_t num_kept,
                       void **saved, char *error, size_t size);
int64_t cellc_saved_bytes(void *saved);
/* The outputs (indices, at most `capacity` of them) that `saved` reads as
 * states' histories; returns how many there are. */
int64_t cellc_saved_outputs_read(void *saved, int64_t *indices, int64_t capacity);
/* The bytes the driver held: kept by the last forward, the last forward's
 * and backward's peaks, and kept now (driver::MemoryStats), into `out[4]`. */
void cellc_driver_memory_stats(void *driver, int64_t *out);
void cellc_saved_free(void *saved);

#ifdef __cplusplus
}
#endif

#endif /* CELLC_RUNTIME_DRIVER_DRIVERC_H */
