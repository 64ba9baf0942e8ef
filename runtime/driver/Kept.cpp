//===- Kept.cpp - What a training forward keeps -----------------------------===//
//
// What a forward keeps for its backward in each recompute mode (its layout,
// the outputs it reads as states' histories), kept in the driver's buffers
// or the caller's, and a backward's Saved made again from the caller's.
//
//===----------------------------------------------------------------------===//

#include "runtime/driver/DriverParts.h"

using namespace cellc;
using namespace cellc::driver;
using namespace cellc::driver::detail;

int64_t SequenceDriver::keptOutput(size_t state, Recompute mode, bool hasLengths,
                                   bool outputsOutliveSaved) const {
  // A kept history is read after the call, and with lengths the outputs
  // past a sample's last step become zeros, which its history must not.
  if (mode.kind == Recompute::Kind::Chunk || hasLengths || !outputsOutliveSaved)
    return -1;
  return cell.stateOutputs[state];
}

std::vector<int64_t> SequenceDriver::keptOutputs(Recompute mode, bool hasLengths,
                                                 bool outputsOutliveSaved) const {
  std::vector<int64_t> outputs;
  for (size_t i = 0; i < cell.states.size(); ++i)
    outputs.push_back(keptOutput(i, mode, hasLengths, outputsOutliveSaved));
  return outputs;
}

std::vector<KeptBuffer> SequenceDriver::keptLayout(Recompute mode, bool hasLengths,
                                                   bool outputsOutliveSaved) const {
  std::vector<KeptBuffer> layout;
  bool chunked = mode.kind == Recompute::Kind::Chunk;
  for (size_t i = 0; i < cell.states.size(); ++i)
    if (keptOutput(i, mode, hasLengths, outputsOutliveSaved) < 0)
      layout.push_back({chunked, cell.states[i].shape[0],
                        chunked ? cell.compute : cell.storage});
  if (mode.kind == Recompute::Kind::None)
    layout.push_back({false, cell.gatesWidth, cell.storage});
  return layout;
}

Status SequenceDriver::makeSaved(const Sequence &seq, Recompute mode,
                                 const std::vector<View> &outputs,
                                 bool outputsOutliveSaved, const std::vector<View> *kept,
                                 SavedPtr &out) {
  int64_t T = seq.steps, B = seq.batch;
  SavedPtr s(new Saved());
  s->mode = mode;
  s->steps = T;
  s->batch = B;
  s->chunkSteps = mode.kind == Recompute::Kind::Chunk ? std::min(mode.chunk, T) : T;
  s->lengths = seq.lengths;
  int64_t chunks = (T + s->chunkSteps - 1) / s->chunkSteps;
  std::vector<KeptBuffer> layout =
      keptLayout(mode, !seq.lengths.empty(), outputsOutliveSaved);
  if (kept && kept->size() != layout.size())
    return Status::error("expected " + std::to_string(layout.size()) +
                         " kept buffers for recompute " + mode.str() + ", got " +
                         std::to_string(kept->size()));
  size_t next = 0;
  // The next kept buffer: the caller's, checked, or the driver's.
  auto take = [&](View &view) {
    const KeptBuffer &b = layout[next];
    std::vector<int64_t> shape = {b.perChunk ? chunks : T, B, b.width};
    std::string what = "kept buffer " + std::to_string(next++);
    if (kept) {
      view = (*kept)[next - 1];
      if (Status e = check(view, shape, what))
        return e;
      if (view.element() != b.element)
        return Status::error(what + " has the wrong element type");
      s->callerBytes += view.size() * bytesOf(b.element);
    } else {
      s->owned.emplace_back();
      if (Status e = scratch(shape, b.element, false, s->owned.back()))
        return e;
      view = s->owned.back().view();
    }
    s->keptBytes += view.size() * bytesOf(b.element);
    return Status();
  };
  for (size_t i = 0; i < cell.states.size(); ++i) {
    int64_t o = keptOutput(i, mode, !seq.lengths.empty(), outputsOutliveSaved);
    s->states.emplace_back();
    if (o >= 0) {
      s->states.back() = outputs[o];
      s->outputsRead.push_back(o);
    } else if (Status e = take(s->states.back())) {
      return e;
    }
  }
  if (mode.kind == Recompute::Kind::None)
    if (Status e = take(s->gates))
      return e;
  if (s->callerBytes) {
    s->ledger = ledger;
    ledger->add(s->callerBytes);
  }
  out = std::move(s);
  return Status();
}

Status SequenceDriver::adopt(const Sequence &seq, Recompute mode,
                             const std::vector<View> &outputs,
                             const std::vector<View> &kept, SavedPtr &out) {
  if (outputs.size() != cell.outputs.size())
    return Status::error("expected " + std::to_string(cell.outputs.size()) + " outputs");
  if (Status e = checkExtent(seq.steps, seq.batch))
    return e;
  // Only the outputs kept as states' histories are read; the others may be
  // absent.
  std::vector<int64_t> read = keptOutputs(mode, !seq.lengths.empty(), true);
  for (size_t i = 0; i < cell.outputs.size(); ++i)
    if (Status e = check(outputs[i], {seq.steps, seq.batch, cell.outputs[i].shape[0]},
                         "output '" + cell.outputs[i].name + "'",
                         /*optional=*/std::find(read.begin(), read.end(), int64_t(i)) == read.end()))
      return e;
  return makeSaved(seq, mode, outputs, /*outputsOutliveSaved=*/true, &kept, out);
}
