//===- Profile.cpp - What a profiling build's barriers counted --------------===//
//
// The counters a profiling build's kernels leave after their barrier words,
// drained into the driver's phase profile after each launch.
//
//===----------------------------------------------------------------------===//

#include "runtime/driver/DriverParts.h"

using namespace cellc;
using namespace cellc::driver;
using namespace cellc::driver::detail;

void SequenceDriver::drainProfile(const Kernel &kernel, bool backward,
                                  const std::vector<Arg> &args) {
  auto words = std::find_if(kernel.args.begin(), kernel.args.end(), [](const KernelArg &a) {
    return a.kind == ArgKind::GridBarrier;
  });
  if (words == kernel.args.end())
    return;
  const View &view = args[words - kernel.args.begin()].view;
  auto *word = static_cast<uint32_t *>(view.pointer());
  if (!word)
    return;
  PhaseProfile &profile = profiles[backward];
  size_t sites = kernel.profileSites.size();
  profile.sites = kernel.profileSites;
  ++profile.launches;
  int64_t groups = view.size() / kernel.barrierWords;
  // The counters of group g, site s, slice k: after the group's 16 barrier
  // words, at [s][k][work, wait].
  int64_t first = kernel.barrierWords - int64_t(sites) * kernel.profileSlices * 2;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t k = 0; k < kernel.profileSlices; ++k) {
      uint32_t *at = word + g * kernel.barrierWords + first + 2 * k;
      bool ran = false;
      for (size_t s = 0; s < sites; ++s)
        ran |= at[s * kernel.profileSlices * 2] || at[s * kernel.profileSlices * 2 + 1];
      if (!ran)
        continue;
      auto thread = std::find_if(profile.threads.begin(), profile.threads.end(),
                                 [&](const PhaseProfile::Thread &t) {
                                   return t.group == g && t.slice == k;
                                 });
      if (thread == profile.threads.end()) {
        profile.threads.push_back({g, k, {}});
        thread = std::prev(profile.threads.end());
      }
      thread->cycles.resize(sites, {0, 0});
      for (size_t s = 0; s < sites; ++s)
        for (int w : {0, 1}) {
          uint32_t &counter = at[s * kernel.profileSlices * 2 + w];
          thread->cycles[s][w] += uint64_t(counter) << kernel.profileShift;
          counter = 0;
        }
    }
}

void SequenceDriver::resetPhaseProfile() {
  for (PhaseProfile &profile : profiles)
    profile = PhaseProfile();
}
