//===- ThreadPool.h - The CPU runtime's persistent threads ------*- C++ -*-===//
//
// The threads that run a launch's batch tiles and the host loops between
// the kernels. They are started once, when first needed, and wait between
// jobs: spinning for 50 microseconds (yielding their core after the first
// few pauses), then asleep. A launch costs a wake,
// not a thread start (a sequence in chunk:K mode launches twice a chunk).
// Or, where the process's other libraries use the same OpenMP runtime, on
// OpenMP's threads (tasksOnOpenMP).
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CPU_THREADPOOL_H
#define CELLC_RUNTIME_CPU_THREADPOOL_H

#include <cstdint>
#include <functional>

namespace cellc::runtime {

/// The cores this process may run on (its affinity mask, as `taskset` sets
/// it), at least 1.
int cores();

/// Runs `task(i)` for each i in [0, count), each on a thread of its own (the
/// caller runs task 0), and returns when all have returned. On OpenMP's
/// threads where tasksOnOpenMP(), else on the shared pool; when the pool is
/// busy (another caller, or a task that runs tasks), on threads started for
/// the call. A thread that starts its task on a CPU where another of the
/// call's threads was found moves to one where none was, if its affinity
/// allows one: the tasks wait for each other at barriers, and two of them
/// on one core would take turns at every barrier.
void runTasks(int count, const std::function<void(int)> &task);

/// Whether runTasks runs on OpenMP's threads (a team of `count` threads
/// whose master is the caller) rather than the runtime's own pool. A library
/// in the same process that uses the same OpenMP runtime (torch built with
/// libgomp) then shares its threads: they spin for a while after each of its
/// parallel ops, and a pool of the runtime's own would share the cores with
/// them. Off unless $CELLC_OPENMP is 1 or setTasksOnOpenMP(true) was called
/// in this process (not in a child after fork).
bool tasksOnOpenMP();
void setTasksOnOpenMP(bool on);

/// Runs `body(begin, end)` over [0, n) split into at most `threads` ranges
/// of at least `grain` each (one range, on the caller: no thread at all).
void parallelRanges(int64_t n, int threads, int64_t grain,
                    const std::function<void(int64_t, int64_t)> &body);

} // namespace cellc::runtime

#endif // CELLC_RUNTIME_CPU_THREADPOOL_H
