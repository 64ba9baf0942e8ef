//===- CellInterpreter.cpp - A reference interpreter of cell IR -----------===//

#include "Support/CellInterpreter.h"

#include "dialects/Cell/IR/CellOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/ErrorHandling.h"

#include <cmath>

using namespace mlir;
using namespace mlir::cell;
using namespace cellc::testing;

static int64_t sizeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getDimSize(0);
}

template <typename Fn>
static Tensor map1(const Tensor &a, Fn fn) {
  Tensor r(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    r[i] = fn(a[i]);
  return r;
}

template <typename Fn>
static Tensor map2(const Tensor &a, const Tensor &b, Fn fn) {
  Tensor r(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    r[i] = fn(a[i], b[i]);
  return r;
}

/// `w @ v`, or `v @ w` when `transposed`, for a weight `[M, N]` or a
/// block-diagonal `[G, M, N]` (block g reads part g of `v`).
static Tensor product(Value weight, const Tensor &w, const Tensor &v, bool transposed) {
  auto type = cast<RankedTensorType>(weight.getType());
  int64_t rank = type.getRank();
  int64_t blocks = rank == 3 ? type.getDimSize(0) : 1;
  int64_t rows = type.getDimSize(rank - 2), cols = type.getDimSize(rank - 1);
  int64_t in = transposed ? rows : cols, out = transposed ? cols : rows;
  Tensor r(blocks * out, 0.0);
  for (int64_t g = 0; g < blocks; ++g)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        double wij = w[(g * rows + i) * cols + j];
        if (transposed)
          r[g * out + j] += wij * v[g * in + i];
        else
          r[g * out + i] += wij * v[g * in + j];
      }
  return r;
}

std::vector<Tensor> CellInterpreter::run(Block &block,
                                         const std::vector<Tensor> &args) {
  values.clear();
  saved.clear();
  if (args.size() != block.getNumArguments())
    llvm::report_fatal_error("interpreter: wrong number of arguments");
  for (auto [arg, value] : llvm::zip(block.getArguments(), args))
    slot(arg) = value;
  runOps(block);
  std::vector<Tensor> results;
  for (Value v : block.getTerminator()->getOperands())
    results.push_back(get(v));
  return results;
}

void CellInterpreter::runOps(Block &block) {
  for (Operation &op : block.without_terminator()) {
    auto set = [&](Tensor t) { slot(op.getResult(0)) = std::move(t); };
    auto in = [&](unsigned i) -> const Tensor & { return get(op.getOperand(i)); };
    llvm::TypeSwitch<Operation *>(&op)
        .Case([&](ParamOp p) { set(params.at(p.getName().str())); })
        .Case([&](ConstantOp c) {
          set(Tensor(sizeOf(c.getResult()), c.getValue().convertToDouble()));
        })
        .Case([&](AddOp) { set(map2(in(0), in(1), std::plus<double>())); })
        .Case([&](SubOp) { set(map2(in(0), in(1), std::minus<double>())); })
        .Case([&](MulOp) { set(map2(in(0), in(1), std::multiplies<double>())); })
        .Case([&](DivOp) { set(map2(in(0), in(1), std::divides<double>())); })
        .Case([&](MaxOp) {
          set(map2(in(0), in(1), [](double a, double b) { return a >= b ? a : b; }));
        })
        .Case([&](MinOp) {
          set(map2(in(0), in(1), [](double a, double b) { return a <= b ? a : b; }));
        })
        .Case([&](PowOp) { set(map2(in(0), in(1), [](double a, double b) { return std::pow(a, b); })); })
        .Case([&](SelectOp) {
          Tensor r = in(1);
          for (size_t i = 0; i < r.size(); ++i)
            if (in(0)[i] == 0)
              r[i] = in(2)[i];
          set(r);
        })
        .Case([&](GreaterOp) {
          set(map2(in(0), in(1), [](double a, double b) { return a > b ? 1.0 : 0.0; }));
        })
        .Case([&](NegOp) { set(map1(in(0), [](double a) { return -a; })); })
        .Case([&](SigmoidOp) {
          set(map1(in(0), [](double a) { return 1.0 / (1.0 + std::exp(-a)); }));
        })
        .Case([&](TanhOp) { set(map1(in(0), [](double a) { return std::tanh(a); })); })
        .Case([&](ExpOp) { set(map1(in(0), [](double a) { return std::exp(a); })); })
        .Case([&](LogOp) { set(map1(in(0), [](double a) { return std::log(a); })); })
        .Case([&](ReluOp) {
          set(map1(in(0), [](double a) { return a > 0 ? a : 0.0; }));
        })
        .Case([&](SoftplusOp) {
          set(map1(in(0), [](double a) { return std::log1p(std::exp(a)); }));
        })
        .Case([&](AbsOp) { set(map1(in(0), [](double a) { return std::fabs(a); })); })
        .Case([&](SqrtOp) { set(map1(in(0), [](double a) { return std::sqrt(a); })); })
        .Case([&](RsqrtOp) {
          set(map1(in(0), [](double a) { return 1.0 / std::sqrt(a); }));
        })
        .Case([&](Log1pOp) { set(map1(in(0), [](double a) { return std::log1p(a); })); })
        .Case([&](SinOp) { set(map1(in(0), [](double a) { return std::sin(a); })); })
        .Case([&](CosOp) { set(map1(in(0), [](double a) { return std::cos(a); })); })
        .Case([&](ErfOp) { set(map1(in(0), [](double a) { return std::erf(a); })); })
        .Case([&](SiluOp) {
          set(map1(in(0), [](double a) { return a / (1.0 + std::exp(-a)); }));
        })
        .Case([&](GeluOp) {
          set(map1(in(0), [](double a) { return 0.5 * a * std::erfc(-a * M_SQRT1_2); }));
        })
        .Case([&](GeluTanhOp) {
          set(map1(in(0), [](double a) {
            return 0.5 * a * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (a + 0.044715 * a * a * a)));
          }));
        })
        .Case([&](EluOp) {
          set(map1(in(0), [](double a) { return a > 0 ? a : std::expm1(a); }));
        })
        .Case([&](MatvecOp m) {
          set(product(m.getWeight(), in(0), in(1), /*transposed=*/false));
        })
        .Case([&](VecmatOp m) {
          set(product(m.getWeight(), in(0), in(1), /*transposed=*/true));
        })
        .Case([&](ProjectionOp p) {
          Tensor r = product(p.getWeight(), in(0), in(1), /*transposed=*/false);
          for (Value bias : p.getBiases())
            for (size_t i = 0; i < r.size(); ++i)
              r[i] += get(bias)[i];
          set(r);
        })
        .Case([&](SumOp) {
          double total = 0;
          for (double a : in(0))
            total += a;
          set(Tensor(1, total));
        })
        .Case([&](BroadcastOp b) { set(Tensor(sizeOf(b.getResult()), in(0)[0])); })
        .Case([&](ExpandOp e) {
          Tensor r(sizeOf(e.getResult()));
          for (size_t f = 0; f < r.size(); ++f)
            r[f] = in(0)[keptIndex(e.getShape(), e.getKept(), f)];
          set(r);
        })
        .Case([&](ReduceOp e) {
          Combine kind = e.getCombineKind();
          double identity = kind == Combine::Sum   ? 0.0
                            : kind == Combine::Max ? -INFINITY
                                                   : INFINITY;
          Tensor r(sizeOf(e.getResult()), identity);
          for (size_t f = 0; f < in(0).size(); ++f) {
            double &at = r[keptIndex(e.getShape(), e.getKept(), f)];
            double x = in(0)[f];
            at = kind == Combine::Sum ? at + x : kind == Combine::Max ? std::max(at, x)
                                                                       : std::min(at, x);
          }
          set(r);
        })
        .Case([&](ChunkOp c) {
          const Tensor &a = in(0);
          int64_t part = sizeOf(c.getResult(0));
          for (auto [k, r] : llvm::enumerate(c.getResults()))
            slot(r) = Tensor(a.begin() + k * part, a.begin() + (k + 1) * part);
        })
        .Case([&](ConcatOp c) {
          Tensor r;
          for (Value v : c.getInputs())
            r.insert(r.end(), get(v).begin(), get(v).end());
          set(r);
        })
        .Case([&](SaveOp s) {
          for (Value v : s.getValues())
            saved.push_back(get(v));
        })
        .Case([&](RestoreOp r) {
          Block &body = r.getBody().front();
          if (!restoreFrom) {
            runOps(body);
            for (auto [result, v] :
                 llvm::zip(r.getResults(), body.getTerminator()->getOperands()))
              slot(result) = get(v);
            return;
          }
          for (auto [result, v] : llvm::zip(r.getResults(), *restoreFrom))
            slot(result) = v;
        })
        .Default([](Operation *other) {
          llvm::report_fatal_error(
              llvm::Twine("interpreter: no rule for ") +
              other->getName().getStringRef());
        });
  }
}
