//===- CudaDriverTest.cpp - The driver and cuBLAS entry points, by name ---===//
//
// libcuda and cuBLAS are opened with dlopen and their functions looked up
// by name, so a misspelt name (a `_v2` left off) shows only where a GPU is.
// The toolkit ships a stub libcuda with every entry point (its cuInit fails:
// no device) and the real libcublas: every name the runtime resolves must be
// in them. Skipped, saying so, where the toolkit is not at /usr/local/cuda.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/Cublas.h"
#include "runtime/cuda/CudaDriver.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

using namespace cellc::cuda;

namespace {

bool exists(const char *path) { return std::ifstream(path).good(); }

/// Sets an environment variable for a scope.
class ScopedEnv {
public:
  ScopedEnv(const char *name, const char *value) : name(name) {
    if (const char *old = std::getenv(name))
      saved = old, had = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had)
      setenv(name, saved.c_str(), 1);
    else
      unsetenv(name);
  }

private:
  const char *name;
  std::string saved;
  bool had = false;
};

TEST(CudaDriverTest, EveryDriverEntryPointIsInTheToolkitsLibcuda) {
  const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (!exists(stub))
    GTEST_SKIP() << "no CUDA toolkit stub at " << stub;
  ScopedEnv env("CELLC_LIBCUDA", stub);
  try {
    Driver::get();
    FAIL() << "the stub libcuda has no device, and the driver found one";
  } catch (const CudaError &e) {
    // Past every look-up: the stub's cuInit says there is no device.
    EXPECT_NE(std::string(e.what()).find("libcuda loaded but found no device"),
              std::string::npos)
        << e.what();
  }
}

TEST(CudaDriverTest, EveryCublasEntryPointIsInTheToolkitsLibrary) {
  const char *cublas = "/usr/local/cuda/lib64/libcublas.so.13";
  if (!exists(cublas))
    GTEST_SKIP() << "no cuBLAS at " << cublas;
  ScopedEnv env("CELLC_CUBLAS", cublas);
  EXPECT_NO_THROW(Cublas::get());
}

TEST(CudaDriverTest, AModulesKernelsAreItsPtxEntries) {
  std::string ptx = ".version 8.0\n.target sm_90\n.visible .entry first(\n.param .u64 a)\n{}\n"
                    ".visible .entry second (\n)\n{}\n// .entry in a comment(\n";
  EXPECT_EQ(ptxEntries(ptx), (std::vector<std::string>{"first", "second"}));
}

} // namespace
