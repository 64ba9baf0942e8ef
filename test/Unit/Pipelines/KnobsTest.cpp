//===- KnobsTest.cpp - The knobs of Knobs.def, set by name ----------------===//

#include "compiler/Pipelines/Pipelines.h"
#include "dialects/Cell/IR/Knobs.h"
#include "jit/CpuJit.h"

#include <gtest/gtest.h>

using namespace cellc;

namespace {

std::string setError(PipelineOptions &options, llvm::StringRef name, llvm::StringRef value) {
  llvm::Error e = setKnob(options, name, value);
  return e ? llvm::toString(std::move(e)) : "";
}

TEST(KnobsTest, everyKnobTakesItsDefaultByName) {
  for (const KnobInfo &knob : kKnobs) {
    PipelineOptions options;
    EXPECT_EQ(setError(options, knob.name, knob.defaultText()), "") << knob.name;
    EXPECT_NE(knob.uses & (KnobCpu | KnobCuda), 0u) << knob.name;
  }
}

TEST(KnobsTest, aKnobSetsItsMember) {
  PipelineOptions options;
  ASSERT_EQ(setError(options, "batch_tile", "8"), "");
  ASSERT_EQ(setError(options, "cta_threads", "128"), "");
  ASSERT_EQ(setError(options, "precision", "tf32"), "");
  EXPECT_EQ(options.batchTile, 8);
  EXPECT_EQ(options.threads, 128);
  EXPECT_EQ(options.precision, Precision::Tf32);
  EXPECT_EQ(findKnob("shared_limit")->flag(), "shared-limit");
}

TEST(KnobsTest, badNamesAndValuesAreRefused) {
  PipelineOptions options;
  EXPECT_EQ(setError(options, "precision", "fp8"),
            "unknown precision 'fp8'; expected ieee, tf32 or bf16");
  EXPECT_EQ(setError(options, "ctas", "two"), "ctas takes an integer, not 'two'");
  EXPECT_EQ(setError(options, "tile", "4"), "unknown knob 'tile'");
}

TEST(KnobsTest, theTunersCudaKnobsSetKnobs) {
  for (const CudaTuneKnob &knob : cudaTuneKnobs()) {
    EXPECT_NE(std::find(knob.values.begin(), knob.values.end(), knob.defaultValue),
              knob.values.end())
        << knob.name;
    if (std::string(knob.name) == "warps")
      continue;
    PipelineOptions options;
    for (int64_t value : knob.values)
      EXPECT_EQ(setError(options, knob.name, std::to_string(value)), "") << knob.name;
  }
}

TEST(KnobsTest, eachCpuKeySetsItsOptionAndComesBack) {
  jit::KernelConfig base = jit::configOf(jit::CpuOptions(), 1);
  EXPECT_EQ(base.size(), cpuTuneKnobs().size());
  for (const CpuTuneKnob &knob : cpuTuneKnobs()) {
    ASSERT_EQ(base.count(knob.name), 1u) << knob.name;
    for (int64_t value : knob.values) {
      jit::KernelConfig config = base;
      config[knob.name] = value;
      jit::CpuOptions options;
      jit::applyConfig(config, options);
      EXPECT_EQ(jit::configOf(options, options.threads), config)
          << knob.name << "=" << value;
    }
  }
}

TEST(KnobsTest, aCpuConfigWithoutAKeySetsItsUnset) {
  jit::CpuOptions options;
  options.threads = 3;
  options.unitSlices = 1;
  options.kernels = jit::CpuOptions::Kernels::PerRow;
  options.batchTile = 16;
  options.matvecUnroll = 4;
  jit::applyConfig({}, options);
  EXPECT_EQ(options.threads, 3);
  EXPECT_EQ(options.unitSlices, -1);
  EXPECT_EQ(options.kernels, jit::CpuOptions::Kernels::Batched);
  EXPECT_EQ(options.batchTile, 0);
  EXPECT_EQ(options.matvecUnroll, 1);
}

} // namespace
