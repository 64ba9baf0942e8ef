//===- ThreadPool.cpp - The CPU runtime's persistent threads --------------===//

#include "runtime/cpu/ThreadPool.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CELLC_PAUSE() _mm_pause()
static inline void storeFence() { _mm_sfence(); }
#else
#define CELLC_PAUSE() std::this_thread::yield()
static inline void storeFence() { std::atomic_thread_fence(std::memory_order_release); }
#endif

using namespace cellc::runtime;

int cellc::runtime::cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

namespace {

/// How long a thread with nothing to do spins before it sleeps: enough for
/// launches that follow each other closely (the pieces of a sequence with
/// lengths, the host loops around them), short beside the GEMMs between
/// chunks, during which a spinning thread would take a core from OpenBLAS.
constexpr auto kSpin = std::chrono::microseconds(50);

/// Pauses a waiting thread spins through before it yields its core.
constexpr int kPauses = 64;

/// The CPUs a job's threads were found on, a bit each (CPU_SETSIZE of them).
class CpuBits {
public:
  /// Marks `cpu`; false if it was marked already.
  bool claim(int cpu) {
    if (cpu < 0 || cpu >= kCpus)
      return true;
    uint64_t bit = uint64_t(1) << (cpu % 64);
    return !(words[cpu / 64].fetch_or(bit, std::memory_order_relaxed) & bit);
  }
  /// Clears the marked CPUs from `set`.
  void removeFrom(cpu_set_t &set) const {
    for (int cpu = 0; cpu < kCpus; ++cpu)
      if (words[cpu / 64].load(std::memory_order_relaxed) >> (cpu % 64) & 1)
        CPU_CLR(cpu, &set);
  }

private:
  static constexpr int kCpus = CPU_SETSIZE;
  std::array<std::atomic<uint64_t>, kCpus / 64> words{};
};

/// Moves the calling thread off the CPU it runs on if another thread of its
/// job was found there first: to a CPU none of them was found on, where
/// there is one. Threads that wait for each other at barriers must not
/// share a core while another core runs something that only spins (OpenBLAS
/// spins, yielding, for about 2^28 cycles after each of its threaded calls;
/// libgomp for a while after each parallel region). The scheduler wakes a
/// thread beside its waker when no core is idle, and a busy system's load
/// balancing can leave it there for tens of milliseconds: every step's
/// barrier then waits for the core to change hands. The thread is not
/// pinned: its affinity is narrowed for the move and given back.
void leaveSharedCpu(CpuBits &taken) {
  if (taken.claim(sched_getcpu()))
    return;
  cpu_set_t allowed, elsewhere;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
    return;
  elsewhere = allowed;
  taken.removeFrom(elsewhere);
  if (CPU_COUNT(&elsewhere) == 0 ||
      sched_setaffinity(0, sizeof(elsewhere), &elsewhere) != 0)
    return;
  sched_setaffinity(0, sizeof(allowed), &allowed);
  taken.claim(sched_getcpu());
}

/// Threads 1 .. n - 1 of a job (the caller is thread 0), kept between jobs.
class Pool {
public:
  /// The process's pool; a child process after fork gets a new one (the
  /// parent's threads are not in it).
  static Pool &shared() {
    static std::mutex made;
    static Pool *pool = nullptr;
    std::lock_guard<std::mutex> lock(made);
    if (!pool || pool->pid != getpid())
      pool = new Pool(); // Never destroyed: its threads sleep until exit.
    return *pool;
  }

  /// Runs the job if no other job is running; false otherwise.
  bool tryRun(int count, const std::function<void(int)> &job) {
    std::unique_lock<std::mutex> mine(busy, std::try_to_lock);
    if (!mine.owns_lock())
      return false;
    while (int(workers.size()) < count - 1) {
      int index = int(workers.size()) + 1;
      // It waits for the job after those before it was started.
      uint64_t seen = generation.load(std::memory_order_relaxed);
      workers.emplace_back([this, index, seen] { work(index, seen); });
      workers.back().detach();
    }
    remaining.store(count - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(sleep);
      current = {generation.load(std::memory_order_relaxed) + 1, &job, count};
      generation.store(current.generation, std::memory_order_release);
    }
    wake.notify_all();
    job(0);
    // Spinning, then yielding: with more threads than cores, the threads
    // still running need this one's core.
    for (int spins = 0; remaining.load(std::memory_order_acquire) != 0; ++spins)
      relax(spins);
    return true;
  }

private:
  Pool() : pid(getpid()) {}

  /// One turn of a wait: a pause for the first spins, then a yield.
  static void relax(int spins) {
    if (spins < kPauses)
      CELLC_PAUSE();
    else
      std::this_thread::yield();
  }

  /// A job as the threads see it: written under `sleep`, with the
  /// generation that announces it.
  struct Job {
    uint64_t generation = 0;
    const std::function<void(int)> *task = nullptr;
    int tasks = 0;
  };

  void work(int index, uint64_t seen) {
    for (;;) {
      Job job = waitForJob(seen);
      seen = job.generation;
      // A thread of this job: the next one cannot start until it is done.
      if (index < job.tasks) {
        (*job.task)(index);
        remaining.fetch_sub(1, std::memory_order_release);
      }
    }
  }

  /// The job after generation `seen`: spun for, then slept for; read under
  /// the lock it was written under, whole.
  Job waitForJob(uint64_t seen) {
    auto until = std::chrono::steady_clock::now() + kSpin;
    for (int spins = 0; generation.load(std::memory_order_acquire) == seen; ++spins) {
      relax(spins);
      if (spins % 64 == 63 && std::chrono::steady_clock::now() > until)
        break;
    }
    std::unique_lock<std::mutex> lock(sleep);
    wake.wait(lock, [&] { return current.generation != seen; });
    return current;
  }

  pid_t pid;
  std::mutex busy, sleep;
  std::condition_variable wake;
  std::vector<std::thread> workers;
  std::atomic<uint64_t> generation{0};
  std::atomic<int> remaining{0};
  Job current;
};

/// The process that turned tasksOnOpenMP on, or 0: a child after fork runs
/// on its own pool (libgomp's threads are the parent's).
std::atomic<pid_t> &openmpProcess() {
  static std::atomic<pid_t> pid{[] {
    const char *env = std::getenv("CELLC_OPENMP");
    return env && std::strcmp(env, "1") == 0 ? getpid() : 0;
  }()};
  return pid;
}

/// Runs the tasks on a team of OpenMP threads; false, having run none,
/// where the team is not `count` threads (OMP_THREAD_LIMIT) or the caller
/// is in a parallel region already.
bool runOnOpenMP(int count, const std::function<void(int)> &task) {
  if (omp_in_parallel())
    return false;
  std::atomic<bool> whole{true};
#pragma omp parallel num_threads(count)
  {
    // Every task waits at its kernel's barriers for the others: all run, or
    // none.
    if (omp_get_num_threads() == count)
      task(omp_get_thread_num());
    else
      whole.store(false, std::memory_order_relaxed);
  }
  return whole.load(std::memory_order_relaxed);
}

} // namespace

bool cellc::runtime::tasksOnOpenMP() { return openmpProcess().load() == getpid(); }

void cellc::runtime::setTasksOnOpenMP(bool on) { openmpProcess().store(on ? getpid() : 0); }

void cellc::runtime::runTasks(int count, const std::function<void(int)> &task) {
  if (count <= 1) {
    if (count == 1)
      task(0);
    return;
  }
  CpuBits taken;
  taken.claim(sched_getcpu());
  std::function<void(int)> spread = [&](int i) {
    if (i > 0)
      leaveSharedCpu(taken);
    else
      sched_yield(); // to a thread just woken beside the caller, if any
    task(i);
    // The kernels' streaming stores (histories, saved gates) are weakly
    // ordered: fenced before the job's end publishes them to the threads
    // that read them next.
    storeFence();
  };
  if (tasksOnOpenMP() && runOnOpenMP(count, spread))
    return;
  if (Pool::shared().tryRun(count, spread))
    return;
  std::vector<std::thread> threads;
  for (int i = 1; i < count; ++i)
    threads.emplace_back([&spread, i] { spread(i); });
  spread(0);
  for (std::thread &t : threads)
    t.join();
}

void cellc::runtime::parallelRanges(int64_t n, int threads, int64_t grain,
                                    const std::function<void(int64_t, int64_t)> &body) {
  int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(threads, n / std::max<int64_t>(grain, 1)));
  if (parts == 1) {
    if (n > 0)
      body(0, n);
    return;
  }
  runTasks(int(parts), [&](int i) { body(n * i / parts, n * (i + 1) / parts); });
}
