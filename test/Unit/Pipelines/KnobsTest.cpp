//===- KnobsTest.cpp - The knobs of Knobs.def, set by name ----------------===//

#include "compiler/Conversion/Passes.h"
#include "compiler/Pipelines/Pipelines.h"
#include "dialects/Cell/IR/Knobs.h"
#include "jit/CpuJit.h"

#include "llvm/Support/raw_ostream.h"

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

/// A pass's options as its textual pipeline prints them, each after a
/// space: " batch-tile=0 cta-threads=256 ...}".
std::string optionsOf(mlir::Pass &pass) {
  std::string text;
  llvm::raw_string_ostream os(text);
  pass.printAsTextualPipeline(os);
  return " " + text.substr(text.find('{') + 1);
}

TEST(KnobsTest, eachKernelPassTakesItsKnobsFromTheList) {
  PipelineOptions knobs;
  knobs.batchTile = 3;
  knobs.threads = 64;
  knobs.precision = Precision::Tf32;
  knobs.productRows = 4;
  knobs.matvecUnroll = 2;
  std::string tiled =
      optionsOf(*mlir::cell::createConvertCellToTiledKernels(knobs, {}));
  std::string batched =
      optionsOf(*mlir::cell::createConvertCellToBatchedKernels(knobs, {}));
  std::string perRow = optionsOf(*mlir::cell::createConvertCellToKernels(knobs));
  // Each pass has an option for each knob it takes, under the knob's flag,
  // and none for the others; the CPU's passes take no words.
  for (const KnobInfo &knob : kKnobs) {
    auto has = [&](const std::string &options) {
      return options.find(" " + knob.flag() + "=") != std::string::npos;
    };
    EXPECT_EQ(has(tiled), (knob.uses & KnobCuda) != 0) << knob.name << tiled;
    EXPECT_EQ(has(batched), (knob.uses & KnobBatched) && !knob.isWord())
        << knob.name << batched;
    EXPECT_EQ(has(perRow), (knob.uses & KnobPerRow) && !knob.isWord())
        << knob.name << perRow;
  }
  // The values set come through, the others keep the knobs' defaults.
  EXPECT_NE(tiled.find("batch-tile=3"), std::string::npos) << tiled;
  EXPECT_NE(tiled.find("cta-threads=64"), std::string::npos) << tiled;
  EXPECT_NE(tiled.find("precision=tf32"), std::string::npos) << tiled;
  EXPECT_NE(tiled.find("shared-limit=49152"), std::string::npos) << tiled;
  EXPECT_NE(batched.find("product-rows=4"), std::string::npos) << batched;
  EXPECT_NE(batched.find("product-vectors=2"), std::string::npos) << batched;
  EXPECT_NE(perRow.find("matvec-unroll=2"), std::string::npos) << perRow;
  EXPECT_NE(perRow.find("matvec-width=0"), std::string::npos) << perRow;
  EXPECT_EQ(perRow, " matvec-unroll=2 matvec-width=0}");
}

} // namespace
