//===- Package.cpp - A compiled cell's kernels.json, read without LLVM ----===//
//
// A small JSON parser (objects, arrays, strings with escapes, numbers,
// true/false/null) and the reading of kernels.json into the driver's
// Interface. The words (argument kinds, element types) go through their one
// parse function each, as in the C interface.
//
//===----------------------------------------------------------------------===//

#include "runtime/driver/Package.h"

#include "dialects/Cell/IR/Checked.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

using namespace cellc;
using namespace cellc::driver;

const Json *Json::get(std::string_view key) const {
  for (const auto &[name, value] : object)
    if (name == key)
      return &value;
  return nullptr;
}

namespace {

class JsonParser {
public:
  explicit JsonParser(std::string_view text) : text(text) {}

  Status parse(Json &out) {
    if (!value(out, 0))
      return Status::error(message + " at byte " + std::to_string(pos));
    skipSpace();
    if (pos != text.size())
      return Status::error("unexpected text after the JSON value at byte " +
                           std::to_string(pos));
    return Status();
  }

private:
  std::string_view text;
  size_t pos = 0;
  std::string message;

  bool failWith(const char *what) {
    message = what;
    return false;
  }
  void skipSpace() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n' ||
                                 text[pos] == '\t' || text[pos] == '\r'))
      ++pos;
  }
  bool literal(std::string_view word) {
    if (text.substr(pos, word.size()) != word)
      return failWith("unknown literal");
    pos += word.size();
    return true;
  }

  bool value(Json &out, int depth) {
    if (depth > 64)
      return failWith("JSON nested too deeply");
    skipSpace();
    if (pos >= text.size())
      return failWith("unexpected end of JSON");
    char c = text[pos];
    if (c == '{')
      return objectValue(out, depth);
    if (c == '[')
      return arrayValue(out, depth);
    if (c == '"') {
      out.kind = Json::Kind::String;
      return string(out.string);
    }
    if (c == 't' || c == 'f') {
      out.kind = Json::Kind::Bool;
      out.boolean = c == 't';
      return literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') {
      out.kind = Json::Kind::Null;
      return literal("null");
    }
    return numberValue(out);
  }

  /// The items of an object or array up to `close`, each read by `item`,
  /// separated by commas.
  template <typename Item> bool items(char close, Item item) {
    ++pos; // the opening bracket
    skipSpace();
    if (pos < text.size() && text[pos] == close) {
      ++pos;
      return true;
    }
    while (true) {
      if (!item())
        return false;
      skipSpace();
      if (pos < text.size() && text[pos] == ',') {
        ++pos;
        continue;
      }
      if (pos < text.size() && text[pos] == close) {
        ++pos;
        return true;
      }
      return failWith(close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
    }
  }

  bool objectValue(Json &out, int depth) {
    out.kind = Json::Kind::Object;
    return items('}', [&] {
      skipSpace();
      std::string key;
      if (pos >= text.size() || text[pos] != '"' || !string(key))
        return failWith("expected a string key");
      skipSpace();
      if (pos >= text.size() || text[pos++] != ':')
        return failWith("expected ':'");
      out.object.emplace_back(std::move(key), Json());
      return value(out.object.back().second, depth + 1);
    });
  }

  bool arrayValue(Json &out, int depth) {
    out.kind = Json::Kind::Array;
    return items(']', [&] {
      out.array.emplace_back();
      return value(out.array.back(), depth + 1);
    });
  }

  bool string(std::string &out) {
    ++pos; // the opening quote
    while (pos < text.size() && text[pos] != '"') {
      char c = text[pos++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos >= text.size())
        break;
      char e = text[pos++];
      switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'u': {
        if (pos + 4 > text.size())
          return failWith("a short \\u escape");
        unsigned code = std::strtoul(std::string(text.substr(pos, 4)).c_str(), nullptr, 16);
        pos += 4;
        // kernels.json is ASCII; anything else is kept as UTF-8.
        if (code < 0x80) {
          out += char(code);
        } else if (code < 0x800) {
          out += char(0xC0 | (code >> 6));
          out += char(0x80 | (code & 0x3F));
        } else {
          out += char(0xE0 | (code >> 12));
          out += char(0x80 | ((code >> 6) & 0x3F));
          out += char(0x80 | (code & 0x3F));
        }
        break;
      }
      default: out += e; break; // \" \\ \/
      }
    }
    if (pos >= text.size())
      return failWith("an unterminated string");
    ++pos;
    return true;
  }

  bool numberValue(Json &out) {
    std::string digits;
    while (pos < text.size() && std::string_view("+-0123456789.eE").find(text[pos]) !=
                                    std::string_view::npos)
      digits += text[pos++];
    if (digits.empty())
      return failWith("unexpected character");
    char *end = nullptr;
    out.kind = Json::Kind::Number;
    out.number = std::strtod(digits.c_str(), &end);
    if (end != digits.c_str() + digits.size())
      return failWith("a malformed number");
    return true;
  }
};

/// Reads the named shapes `[[name, [d...]], ...]` of `slots[key]`.
Status readSlots(const Json &slots, const char *key, std::vector<Slot> &out) {
  const Json *list = slots.get(key);
  if (!list || list->kind != Json::Kind::Array)
    return Status::error(std::string("\"slots\" has no list \"") + key + "\"");
  for (const Json &entry : list->array) {
    if (entry.kind != Json::Kind::Array || entry.array.size() != 2 ||
        entry.array[0].kind != Json::Kind::String ||
        entry.array[1].kind != Json::Kind::Array)
      return Status::error(std::string("a malformed slot in \"") + key + "\"");
    Slot slot;
    slot.name = entry.array[0].string;
    for (const Json &d : entry.array[1].array)
      slot.shape.push_back(d.integer());
    std::optional<int64_t> elements = checkedProduct(slot.shape);
    if (!elements || !checkedMul(*elements, 8) || *elements == 0)
      return Status::error(std::string("\"") + key + "\" gives '" + slot.name +
                           "' the shape " + shapeString(slot.shape) +
                           ", which is not a count of elements that int64 bytes hold");
    out.push_back(std::move(slot));
  }
  return Status();
}

std::string stringOf(const Json *value) {
  return value && value->kind == Json::Kind::String ? value->string : "";
}

/// One argument as kernels.json writes it (compiler/Pipelines/Package.cpp).
Status readArg(const Json &a, KernelArg &arg) {
  std::optional<ArgKind> kind = parse<ArgKind>(stringOf(a.get("kind")));
  if (!kind)
    return Status::error("unknown kernel argument kind '" + stringOf(a.get("kind")) +
                         "'; expected " + Words<ArgKind>::expected());
  arg.kind = *kind;
  arg.name = stringOf(a.get("name"));
  arg.input = stringOf(a.get("input"));
  if (const Json *biases = a.get("biases"))
    for (const Json &b : biases->array)
      arg.biases.push_back(b.string);
  if (const Json *same = a.get("same_as"))
    arg.sameAs = same->integer();
  if (const Json *zero = a.get("zero"))
    arg.zero = zero->boolean;
  const Json *memref = a.get("memref");
  if (memref && memref->boolean) {
    std::string element = stringOf(a.get("element"));
    arg.element = parseElement(element);
    if (!arg.element)
      return Status::error("unknown element type '" + element + "'");
    if (const Json *shape = a.get("shape"))
      for (const Json &d : shape->array)
        arg.shape.push_back(d.integer());
    // -1 for T and B; every other dim a size.
    int64_t elements = 1;
    for (int64_t d : arg.shape) {
      std::optional<int64_t> next = d == -1 ? elements : checkedMul(elements, d);
      if (!next || !checkedMul(*next, 8))
        return Status::error("argument '" + arg.name + "' has the shape " +
                             shapeString(arg.shape) +
                             ", which is not a count of elements that int64 bytes hold");
      elements = *next;
    }
  }
  return Status();
}

/// The kernel called `name`: its arguments, tile, workspace and scratch.
Status readKernel(const Json &kernels, const std::string &name, Kernel &kernel) {
  const Json *k = kernels.get(name);
  if (!k)
    return Status::error("no kernel '" + name + "'");
  const Json *args = k->get("args");
  if (!args || args->kind != Json::Kind::Array)
    return Status::error("kernel '" + name + "' has no \"args\"");
  for (const Json &a : args->array) {
    KernelArg arg;
    if (Status s = readArg(a, arg))
      return Status::error("kernel '" + name + "': " + s.message());
    kernel.args.push_back(std::move(arg));
  }
  if (const Json *tile = k->get("batch_tile"))
    kernel.batchTile = tile->integer();
  if (const Json *workspace = k->get("workspace_bytes"))
    kernel.workspaceBytes = workspace->integer();
  if (const Json *words = k->get("barrier_words"))
    kernel.barrierWords = words->integer();
  if (const Json *sites = k->get("profile_sites")) {
    for (const Json &site : sites->array)
      kernel.profileSites.push_back(site.string);
    if (const Json *slices = k->get("profile_slices"))
      kernel.profileSlices = slices->integer();
    if (const Json *shift = k->get("profile_shift"))
      kernel.profileShift = shift->integer();
  }
  // What the driver multiplies by the rows, the tiles and the groups: sizes
  // a kernel can have, not what a corrupt file says.
  if (kernel.batchTile < 1 || kernel.batchTile > (int64_t(1) << 30) ||
      kernel.workspaceBytes < 0 || kernel.workspaceBytes > (int64_t(1) << 56) ||
      kernel.barrierWords < 0 || kernel.barrierWords > (int64_t(1) << 20))
    return Status::error("kernel '" + name + "' has a batch_tile, workspace_bytes or "
                         "barrier_words out of range");
  for (auto [key, field] : {std::pair{"threads", &kernel.threads},
                             {"dynamic_shared_bytes", &kernel.dynamicSharedBytes},
                             {"ctas", &kernel.ctas},
                             {"global_weights", &kernel.globalWeights},
                             {"heads", &kernel.heads}})
    if (const Json *value = k->get(key))
      *field = value->integer();
  if (const Json *strategy = k->get("strategy")) {
    kernel.strategy = parse<Strategy>(stringOf(strategy));
    if (!kernel.strategy)
      return Status::error("kernel '" + name + "' has an unknown strategy '" +
                           stringOf(strategy) + "'; expected " + Words<Strategy>::expected());
  }
  if (const Json *registers = k->get("registers")) {
    if (const Json *replay = registers->get("replay"))
      kernel.registers[0] = replay->integer();
    if (const Json *save = registers->get("save"))
      kernel.registers[1] = save->integer();
    for (int64_t r : kernel.registers)
      if (r < -1 || r > 255)
        return Status::error("kernel '" + name + "' has registers out of range");
  }
  if (const Json *scratch = k->get("scratch_bytes")) {
    if (const Json *replay = scratch->get("replay"))
      kernel.scratchBytes[0] = replay->integer();
    if (const Json *save = scratch->get("save"))
      kernel.scratchBytes[1] = save->integer();
  }
  return Status();
}

Status readInfo(const Json &root, PackageInfo &out) {
  if (root.kind != Json::Kind::Object)
    return Status::error("not a JSON object");
  if (const Json *format = root.get("format"); !format || format->integer() != 2)
    return Status::error("unknown package format " +
                         (format ? std::to_string(format->integer()) : std::string("(none)")) +
                         "; this runtime reads format 2 (rebuild the package with this "
                         "cellc)");
  out.cell = stringOf(root.get("cell"));
  out.target = stringOf(root.get("target"));
  if (out.target.empty())
    out.target = "cuda"; // format 2 packages were CUDA's only
  out.dtype = stringOf(root.get("dtype"));
  out.config = stringOf(root.get("config"));
  if (out.cell.empty())
    return Status::error("no \"cell\"");
  std::optional<Element> compute = parseElement(out.dtype);
  if (!compute || (*compute != Element::F32 && *compute != Element::F64))
    return Status::error("\"dtype\" must be f32 or f64, not '" + out.dtype + "'");
  if (const Json *sizes = root.get("sizes"))
    for (const auto &[name, value] : sizes->object)
      out.sizes[name] = value.integer();
  const Json *slots = root.get("slots");
  if (!slots)
    return Status::error("no \"slots\"");
  for (auto [key, list] : {std::pair{"inputs", &out.inputs}, {"states", &out.states},
                           {"params", &out.params}, {"outputs", &out.outputs}})
    if (Status s = readSlots(*slots, key, *list))
      return s;
  if (const Json *dims = root.get("state_dims")) {
    for (const auto &[name, shape] : dims->object) {
      size_t at = indexOf(out.states, name);
      int64_t elements = 1;
      std::vector<int64_t> list;
      for (const Json &d : shape.array) {
        list.push_back(d.kind == Json::Kind::Number ? d.integer() : 0);
        elements *= list.back();
      }
      if (at == size_t(-1) || list.empty() || elements != out.states[at].shape[0])
        return Status::error("\"state_dims\" gives '" + name + "' dims " + shapeString(list) +
                             ", which are not a state's elements");
      out.stateDims[name] = std::move(list);
    }
  }
  if (const Json *features = root.get("cpu_features"))
    for (const Json &f : features->array)
      out.cpuFeatures.push_back(f.string);
  const Json *files = root.get(out.target == "cpu" ? "objects" : "ptx");
  if (!files)
    return Status::error(out.target == "cpu" ? "no \"objects\"" : "no \"ptx\"");
  out.objects[0] = stringOf(files->get("replay"));
  out.objects[1] = stringOf(files->get("save"));
  out.arch = stringOf(root.get("arch"));
  out.precision = stringOf(root.get("precision"));
  out.strategy = stringOf(root.get("strategy"));
  out.storage = stringOf(root.get("storage"));
  if (const Json *mma = root.get("mma_sites"))
    out.mmaSites = mma->integer();
  if (const Json *simt = root.get("simt")) {
    out.simtObjects[0] = stringOf(simt->get("replay"));
    out.simtObjects[1] = stringOf(simt->get("save"));
  }
  const Json *kernels = root.get("kernels");
  if (!kernels)
    return Status::error("no \"kernels\"");
  out.interface = Interface();
  out.interface.compute = *compute;
  if (Status s = readKernel(*kernels, out.cell + "_fwd", out.interface.forward))
    return s;
  if (Status s = readKernel(*kernels, out.cell + "_bwd", out.interface.backward))
    return s;
  return out.interface.finish();
}

} // namespace

Status cellc::driver::parseJson(std::string_view text, Json &out) {
  out = Json();
  return JsonParser(text).parse(out);
}

Status cellc::driver::parsePackage(std::string_view text, const std::string &dir,
                                   PackageInfo &out) {
  out = PackageInfo();
  out.directory = dir;
  Json root;
  Status s = parseJson(text, root);
  if (!s)
    s = readInfo(root, out);
  if (s)
    return Status::error(dir + "/kernels.json: " + s.message());
  return Status();
}

Status cellc::driver::readPackage(const std::string &dir, PackageInfo &out) {
  std::ifstream file(dir + "/kernels.json");
  if (!file)
    return Status::error("no package in '" + dir + "': cannot read " + dir +
                         "/kernels.json");
  std::stringstream text;
  text << file.rdbuf();
  return parsePackage(text.str(), dir, out);
}

Status cellc::driver::kernelParams(const PackageInfo &info,
                                   const std::vector<View> &callers,
                                   const std::string &what, bool required,
                                   std::vector<View> &out, std::vector<View> *unread) {
  const std::vector<Slot> &read = info.interface.params;
  // `out` may be `callers`.
  std::vector<View> given = callers;
  bool bySlots = given.size() == info.params.size();
  if (!bySlots && given.size() != read.size()) {
    out = given; // the driver says how many it takes
    return Status();
  }
  out.clear();
  for (size_t p = 0; p < read.size(); ++p) {
    const Slot &param = read[p];
    size_t at = bySlots ? indexOf(info.params, param.name) : p;
    if (at == size_t(-1))
      return Status::error("the kernels read a param '" + param.name +
                           "' that the package does not declare");
    const View &v = given[at];
    if (required && (!v.valid() || v.size() == 0))
      return Status::error("no tensor for " + what + " '" + param.name + "'");
    out.push_back(v);
  }
  if (unread && bySlots)
    for (size_t i = 0; i < info.params.size(); ++i)
      if (indexOf(read, info.params[i].name) == size_t(-1) && given[i].valid())
        unread->push_back(given[i]);
  return Status();
}
