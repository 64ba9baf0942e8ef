//===- ThreadPoolTest.cpp - The CPU runtime's persistent threads ----------===//

#include "runtime/cpu/ThreadPool.h"

#include "gtest/gtest.h"

#include <omp.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

using namespace cellc::runtime;

namespace {

TEST(ThreadPool, CoresAreTheAffinityMask) {
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(cores(), CPU_COUNT(&set));
  // One core allowed: one core counted, whatever the machine has.
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) {
      CPU_SET(c, &one);
      break;
    }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_EQ(cores(), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof(set), &set), 0);
}

TEST(ThreadPool, EachTaskRunsOnceOnAThreadOfItsOwn) {
  for (int count : {1, 2, 3, 5}) {
    std::vector<int> runs(count, 0);
    std::mutex lock;
    std::set<std::thread::id> ids;
    runTasks(count, [&](int i) {
      ++runs[i];
      std::lock_guard<std::mutex> hold(lock);
      ids.insert(std::this_thread::get_id());
    });
    EXPECT_EQ(runs, std::vector<int>(count, 1)) << "count " << count;
    EXPECT_EQ(int(ids.size()), count) << "count " << count;
  }
}

/// Many short jobs in a row, as launches in a chunked sequence come: none
/// is lost between a thread's spin and its sleep, and none runs twice.
TEST(ThreadPool, JobsInARowAreNeitherLostNorRepeated) {
  std::atomic<int64_t> sum{0};
  const int jobs = 20000;
  for (int j = 0; j < jobs; ++j) {
    runTasks(3, [&](int i) { sum += i + 1; });
    // Now and then long enough that the threads fall asleep.
    if (j % 2000 == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(sum.load(), int64_t(jobs) * 6);
}

/// Two callers at once (two Python threads on two cells), and a task that
/// runs tasks: one gets the pool, the other threads of its own; all finish.
TEST(ThreadPool, ConcurrentAndNestedCallersFinish) {
  std::atomic<int> done{0};
  auto caller = [&] {
    for (int j = 0; j < 500; ++j)
      runTasks(2, [&](int) {
        runTasks(2, [&](int) { ++done; });
      });
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(done.load(), 2 * 500 * 2 * 2);
}

TEST(ThreadPool, RangesCoverEveryIndexOnce) {
  for (int64_t n : {0, 1, 7, 1000, 100003}) {
    std::vector<int> seen(n, 0);
    std::atomic<int> ranges{0};
    parallelRanges(n, 3, 100, [&](int64_t b, int64_t e) {
      ++ranges;
      for (int64_t i = b; i < e; ++i)
        ++seen[i];
    });
    EXPECT_EQ(seen, std::vector<int>(n, 1)) << "n " << n;
    // At most 3, each at least the grain; one for what fits in one grain.
    EXPECT_LE(ranges.load(), n < 300 ? 1 : 3) << "n " << n;
  }
}

/// Runs `count` tasks that each wait for all of them to have started, as a
/// kernel's slices wait at its barriers: true when every task ran once and
/// they ran at once (none waited 10 s for the others).
bool runAtOnce(int count, std::vector<int> *threadNums = nullptr) {
  std::atomic<int> arrived{0};
  std::atomic<bool> stuck{false};
  std::vector<int> runs(count, 0);
  if (threadNums)
    threadNums->assign(count, -1);
  runTasks(count, [&](int i) {
    ++runs[i];
    if (threadNums)
      (*threadNums)[i] = omp_in_parallel() ? omp_get_thread_num() : -1;
    ++arrived;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (arrived.load() < count)
      if (std::chrono::steady_clock::now() > until) {
        stuck = true;
        return;
      }
  });
  return !stuck && runs == std::vector<int>(count, 1);
}

/// On OpenMP, task i runs on thread i of a team whose master is the caller.
TEST(ThreadPool, OnOpenMPTaskIRunsOnThreadIOfATeam) {
  setTasksOnOpenMP(true);
  EXPECT_TRUE(tasksOnOpenMP());
  for (int count : {2, 3, 5}) {
    std::vector<int> nums;
    EXPECT_TRUE(runAtOnce(count, &nums)) << "count " << count;
    std::vector<int> want(count);
    for (int i = 0; i < count; ++i)
      want[i] = i;
    EXPECT_EQ(nums, want) << "count " << count;
  }
  setTasksOnOpenMP(false);
  EXPECT_FALSE(tasksOnOpenMP());
  std::vector<int> nums;
  EXPECT_TRUE(runAtOnce(3, &nums));
  EXPECT_EQ(nums, std::vector<int>(3, -1)) << "the pool's threads are not OpenMP's";
}

/// Called inside a parallel region (no nested team), the tasks run on the
/// pool, all at once.
TEST(ThreadPool, OnOpenMPInsideAParallelRegionTheTasksRunOnThePool) {
  setTasksOnOpenMP(true);
  std::atomic<bool> ok{false};
#pragma omp parallel num_threads(2)
  {
    if (omp_get_thread_num() == 0)
      ok = runAtOnce(3);
  }
  setTasksOnOpenMP(false);
  EXPECT_TRUE(ok.load());
}

/// A job's thread that finds itself on the caller's CPU moves to another
/// one allowed, and keeps the mask it had. Here the caller is pinned to one
/// CPU and the worker is left spinning on it by the job before, as a thread
/// woken beside its waker is when the other cores run something that spins
/// (OpenBLAS's threads after a GEMM). Sharing the core, every barrier of a
/// kernel would wait for it to change hands.
TEST(ThreadPool, AJobsThreadsLeaveTheCallersCpu) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  if (CPU_COUNT(&all) < 2)
    GTEST_SKIP() << "one CPU allowed";
  int first = 0;
  while (!CPU_ISSET(first, &all))
    ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  for (bool openmp : {false, true}) {
    SCOPED_TRACE(openmp ? "OpenMP" : "pool");
    setTasksOnOpenMP(openmp);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    for (int round = 0; round < 20; ++round) {
      // The worker goes to the caller's CPU and, let go, spins there.
      runTasks(2, [&](int i) {
        if (i == 1) {
          sched_setaffinity(0, sizeof(one), &one);
          sched_setaffinity(0, sizeof(all), &all);
        }
      });
      int cpus[2] = {-1, -1};
      bool whole = false;
      runTasks(2, [&](int i) {
        cpus[i] = sched_getcpu();
        if (i == 1) {
          cpu_set_t mine;
          whole = sched_getaffinity(0, sizeof(mine), &mine) == 0 && CPU_EQUAL(&mine, &all);
        }
      });
      EXPECT_EQ(cpus[0], first) << "round " << round;
      EXPECT_NE(cpus[1], first) << "round " << round;
      EXPECT_TRUE(whole) << "round " << round << ": the worker's mask was not given back";
    }
    ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
  }
  setTasksOnOpenMP(false);
}

/// A child forked after the pool ran (cellc-tune forks, so does
/// multiprocessing) runs tasks on a pool of its own, whether the parent ran
/// them on its pool or on OpenMP's threads.
TEST(ThreadPool, AChildAfterForkRunsTasks) {
  for (bool openmp : {false, true}) {
    SCOPED_TRACE(openmp ? "OpenMP" : "pool");
    setTasksOnOpenMP(openmp);
    ASSERT_TRUE(runAtOnce(2));
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0)
      _exit(!tasksOnOpenMP() && runAtOnce(2) ? 0 : 1);
    setTasksOnOpenMP(false);
    int status = 0;
    for (int waited = 0; waited < 1000; ++waited) {
      if (waitpid(child, &status, WNOHANG) == child)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (waitpid(child, &status, WNOHANG) == 0) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      FAIL() << "the child hung";
    }
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
}

} // namespace
