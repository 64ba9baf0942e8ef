/*===- CpuC.h - The CPU runtime's C interface ----------------------*- C -*-===//
 *
 * What python/cellc/_cellc_runtime.py calls through ctypes: CPU packages
 * loaded and run, the runtime's buffers lent to torch, and the chunk form's
 * cores. A C interface rather than an extension module, so that one wheel
 * serves every CPython (issue 61). As in CudaC.h, a function that can fail
 * returns 0 on success and 1 with the reason in `error`; nothing calls back.
 *
 * A call's tensors cross as one array of int64 (`lists`): its lists in the
 * order the function names, each as its count and then, for each tensor,
 * its data pointer, its rank and its dims (a tensor not given: pointer 0,
 * rank 0). One array, so that Python builds one ctypes object per call.
 *
 *===----------------------------------------------------------------------===*/

#ifndef CELLC_RUNTIME_CPU_CPUC_H
#define CELLC_RUNTIME_CPU_CPUC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

const char *cellc_runtime_version(void);

/* The package in `directory`, loaded; `from_cache` and `origin` say where
 * its config came from, for Python to read back. */
void *cellc_cpu_load(const char *directory, int32_t threads, int32_t from_cache,
                     const char *origin, char *error, size_t size);
void cellc_cpu_free(void *cell);
/* {"package": the package (driver::describePackage), "config": name=value
 * pairs, "config_source", "loaded_from_cache"}, as JSON text. */
char *cellc_cpu_describe(void *cell);
void cellc_cpu_free_text(char *text);

int32_t cellc_cpu_threads(void *cell);
void cellc_cpu_set_threads(void *cell, int32_t threads);
/* 1 (units), 0 (rows) or -1 (chosen by the batch). */
int32_t cellc_cpu_unit_slices(void *cell);
void cellc_cpu_set_unit_slices(void *cell, int32_t mode);
/* (groups, slices) of a launch over `batch` rows into out[2]. */
void cellc_cpu_thread_split(void *cell, int64_t batch, int64_t *out);

/* The forward. `call`: the resets' pointer (0: none), steps, batch,
 * batch first (1 or 0), training (1 or 0), the count of lengths and the
 * lengths (0: all T), then the lists: inputs, params, initial states,
 * outputs, finals and, with `training`, the kept buffers (laid out as
 * kept_layout says), where a training forward leaves what
 * cellc_cpu_backward_kept reads. The scalars travel in the array too: each
 * argument ctypes converts costs a tenth of a microsecond. */
int cellc_cpu_forward(void *cell, const int64_t *call, const char *mode, char *error,
                      size_t size);
/* One step of inference. Lists: inputs, params, states, outputs, new
 * states; the params' versions (num_versions -1: none). */
int cellc_cpu_step(void *cell, const int64_t *lists, const int64_t *versions,
                   int64_t num_versions, char *error, size_t size);
/* A step, then that step bound to these tensors' shapes into `bound` (null
 * where it cannot be; free it with cellc_cpu_bound_free). */
int cellc_cpu_bind_step(void *cell, const int64_t *lists, const int64_t *versions,
                        int64_t num_versions, void **bound, char *error, size_t size);
/* Steps the tensors whose data pointers `args` gives (inputs, params,
 * states, outputs, new states), then the params' versions, as
 * [count, pointers..., count, versions...]: one array, so that Python
 * builds one ctypes object for the call that streams run at every step.
 * 0: it ran; 2 (CELLC_NOT_BOUND): nothing ran, bind again; 1: an error,
 * which cellc_cpu_bound_error then says on the thread that ran it. */
#define CELLC_NOT_BOUND 2
int cellc_cpu_bound_run(void *bound, const int64_t *args);
const char *cellc_cpu_bound_error(void);
void cellc_cpu_bound_free(void *bound);

/* What a training forward in `mode` keeps, as JSON text into `text`:
 * {"buffers": [[per chunk, width, "f32" or "f64"]...], "outputs": [the
 * outputs kept as states' histories]}. */
int cellc_cpu_kept_layout(void *cell, const char *mode, int32_t has_lengths, char **text,
                          char *error, size_t size);
/* The backward of a forward whose kept buffers the caller holds. `call`:
 * the resets' pointer, steps, batch, the count of lengths and the lengths,
 * then the lists: inputs, params, states, outputs, kept, grad outputs, grad
 * finals, grad inputs, grad params, grad states. */
int cellc_cpu_backward_kept(void *cell, const int64_t *call, const char *mode, char *error,
                            size_t size);
/* kept, forward peak, backward peak, live (driver::MemoryStats) into out[4]. */
void cellc_cpu_memory_stats(void *cell, int64_t *out);
/* A training step's bytes into out[12], in cellc_cuda_plan's order. */
int cellc_cpu_memory_plan(void *cell, int64_t steps, int64_t batch, const char *mode,
                          int64_t *out, char *error, size_t size);
int cellc_cpu_check_mode(const char *mode, char *error, size_t size);

/* A dense buffer of the runtime's, as a DLPack DLManagedTensor (version
 * 0.x) for Python to put in a "dltensor" capsule: its pages go back to the
 * runtime's cache when its deleter runs. cellc_cpu_lent_drop runs the
 * deleter of one no consumer took; cellc_cpu_capsule_destructor is the
 * capsule's destructor (PyCapsule_Destructor), which drops it unless torch
 * took it, with Python's C API found in the process. */
void *cellc_cpu_lend(const int64_t *shape, int32_t rank, int32_t f64, char *error,
                     size_t size);
void cellc_cpu_lent_drop(void *managed);
void cellc_cpu_capsule_destructor(void *capsule);
int64_t cellc_cpu_lent_bytes(void);
int64_t cellc_cpu_cached_bytes(void);
void cellc_cpu_empty_cache(void);
int32_t cellc_cpu_tasks_on_openmp(void);
void cellc_cpu_set_tasks_on_openmp(int32_t on);
const char *cellc_cpu_gemm_library(void);

/* The chunk form's cores (runtime/cpu/ChunkCore.h); `shape` is BH, T, K,
 * V, L; the pointer lists hold `reads` entries. */
int cellc_cpu_chunk_forward(int32_t f64, const int64_t *shape, int32_t rows, int32_t reads,
                            const void *a, const void *k, const void *v, const void *S0,
                            const void *const *qs, void *const *outs, void *starts,
                            void *end, void *pairs, int32_t threads, char *error,
                            size_t size);
int cellc_cpu_chunk_backward(int32_t f64, const int64_t *shape, int32_t rows, int32_t reads,
                             const void *a, const void *k, const void *v, const void *starts,
                             const void *end, const void *pairs, const void *const *qs,
                             const void *const *douts, const void *dEnd, void *da,
                             void *dk, void *dv, void *dS0, void *const *dqs,
                             int32_t threads, char *error, size_t size);
int cellc_cpu_delta_forward(int32_t f64, const int64_t *shape, int32_t reads, const void *a,
                            const void *k, const void *w, const void *beta, const void *S0,
                            const void *const *qs, void *const *outs, void *starts,
                            void *end, int32_t threads, char *error, size_t size);
int cellc_cpu_delta_backward(int32_t f64, const int64_t *shape, int32_t reads, const void *a,
                             const void *k, const void *w, const void *beta,
                             const void *starts, const void *end, const void *const *qs,
                             const void *const *douts, const void *dEnd, void *da, void *dk,
                             void *dw, void *dbeta, void *dS0, void *const *dqs,
                             int32_t threads, char *error, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* CELLC_RUNTIME_CPU_CPUC_H */
