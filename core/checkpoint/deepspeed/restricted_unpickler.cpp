#include "core/checkpoint/deepspeed/restricted_unpickler.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <unordered_map>

#include "core/error.h"

namespace tessera::checkpoint::deepspeed {
namespace {

using Mutable = std::shared_ptr<PickleValue>;

// What a known global is, when it is called or used as a storage type.
enum class Global { ordered_dict, set, getattr, rebuild_tensor, size, storage, ds_object, zero_stage_enum, dtype };

struct KnownGlobal {
  Global role;
  affine::DType dtype = affine::DType::f32;  // storage types
};

const std::map<std::string, KnownGlobal>& known_globals() {
  using affine::DType;
  static const std::map<std::string, KnownGlobal> table = {
      {"collections.OrderedDict", {Global::ordered_dict}},
      {"__builtin__.set", {Global::set}},
      {"builtins.set", {Global::set}},
      {"__builtin__.getattr", {Global::getattr}},
      {"builtins.getattr", {Global::getattr}},
      {"torch._utils._rebuild_tensor_v2", {Global::rebuild_tensor}},
      {"torch.Size", {Global::size}},
      {"torch.FloatStorage", {Global::storage, DType::f32}},
      {"torch.BFloat16Storage", {Global::storage, DType::bf16}},
      {"torch.HalfStorage", {Global::storage, DType::f16}},
      {"torch.DoubleStorage", {Global::storage, DType::f64}},
      {"torch.LongStorage", {Global::storage, DType::i64}},
      {"torch.IntStorage", {Global::storage, DType::i32}},
      {"torch.ShortStorage", {Global::storage, DType::i16}},
      {"torch.CharStorage", {Global::storage, DType::i8}},
      {"torch.ByteStorage", {Global::storage, DType::u8}},
      {"torch.BoolStorage", {Global::storage, DType::bool8}},
      {"deepspeed.runtime.fp16.loss_scaler.LossScaler", {Global::ds_object}},
      {"deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", {Global::ds_object}},
      {"deepspeed.utils.tensor_fragment.fragment_address", {Global::ds_object}},
      {"deepspeed.runtime.zero.config.ZeroStageEnum", {Global::zero_stage_enum}},
      // DynamicLossScaler keeps its dtype (torch.half by default), pickled as a reference to it.
      {"torch.float16", {Global::dtype, DType::f16}},
      {"torch.bfloat16", {Global::dtype, DType::bf16}},
      {"torch.float32", {Global::dtype, DType::f32}},
  };
  return table;
}

// DeepSpeed's ZeroStageEnum: names and values.
const std::map<std::string, int64_t>& zero_stages() {
  static const std::map<std::string, int64_t> stages = {
      {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}, {"max_stage", 3}};
  return stages;
}

// Names of the opcodes this VM refuses, for the message (Lib/pickletools.py's names).
const char* refused_opcode_name(unsigned char op) {
  switch (op) {
    case 'I': return "INT";
    case 'L': return "LONG";
    case 'F': return "FLOAT";
    case 'S': return "STRING";
    case 'V': return "UNICODE";
    case 'P': return "PERSID";
    case 'g': return "GET";
    case 'p': return "PUT";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x8b: return "LONG4";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x8e: return "BINBYTES8";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

Mutable make(PickleKind kind) {
  auto v = std::make_shared<PickleValue>();
  v->kind = kind;
  return v;
}

class Vm {
 public:
  Vm(std::string_view bytes, std::string where) : in_(bytes), where_(std::move(where)) {}
  PickleRef run();

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw CheckpointError(where_ + ": pickle " + what + " at byte " + std::to_string(op_at_));
  }
  const char* take(size_t n) {
    if (in_.size() - at_ < n) fail("truncated (" + std::to_string(n) + " bytes wanted, " + std::to_string(in_.size() - at_) + " left)");
    const char* p = in_.data() + at_;
    at_ += n;
    return p;
  }
  uint64_t unsigned_le(size_t n) {
    const auto* p = reinterpret_cast<const unsigned char*>(take(n));
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | p[i];
    return v;
  }
  std::string line() {
    const auto end = in_.find('\n', at_);
    if (end == std::string_view::npos) fail("truncated (a line without its end)");
    std::string s(in_.substr(at_, end - at_));
    at_ = end + 1;
    return s;
  }
  void push(Mutable v) { stack_.push_back(std::move(v)); }
  Mutable pop() {
    if (stack_.size() <= floor()) fail("stack underflow");
    auto v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  Mutable& top() {
    if (stack_.size() <= floor()) fail("stack underflow");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<Mutable> pop_mark() {
    if (marks_.empty()) fail("MARK missing");
    std::vector<Mutable> items(stack_.begin() + long(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  void integer(int64_t v) {
    auto x = make(PickleKind::integer);
    x->integer = v;
    push(x);
  }
  void string(std::string s) {
    auto x = make(PickleKind::string);
    x->text = std::move(s);
    push(x);
  }
  void tuple(std::vector<Mutable> items) {
    auto t = make(PickleKind::tuple);
    t->items.assign(items.begin(), items.end());
    push(t);
  }
  void put(uint64_t index) { memo_[index] = top(); }
  void get(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) fail("memo entry " + std::to_string(index) + " read before it was written");
    push(it->second);
  }
  void long1();
  void binfloat();
  void set_items(std::vector<Mutable> items);
  void append_items(std::vector<Mutable> items);
  void global(const std::string& name);
  void reduce();
  void newobj();
  void build();
  void persistent_id();
  bool step(unsigned char op);

  std::string_view in_;
  std::string where_;
  size_t at_ = 0, op_at_ = 0;
  std::vector<Mutable> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Mutable> memo_;
};

void Vm::long1() {
  const size_t n = size_t(unsigned_le(1));
  if (n > 8) fail("LONG1 of " + std::to_string(n) + " bytes (more than 64 bits)");
  uint64_t v = n ? unsigned_le(n) : 0;
  if (n && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
  integer(int64_t(v));
}

void Vm::binfloat() {
  const auto* p = reinterpret_cast<const unsigned char*>(take(8));
  uint64_t bits = 0;
  for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];  // big-endian
  auto x = make(PickleKind::floating);
  std::memcpy(&x->floating, &bits, 8);
  push(x);
}

void Vm::set_items(std::vector<Mutable> items) {
  auto& d = top();
  if (d->kind != PickleKind::dict) fail(std::string("SETITEMS on a ") + kind_name(d->kind));
  if (items.size() % 2) fail("SETITEMS with an odd number of items");
  for (size_t i = 0; i < items.size(); i += 2) {
    auto& entries = d->entries;  // a repeated key replaces, as in a dict
    bool replaced = false;
    for (auto& [k, v] : entries)
      if (k->kind == items[i]->kind && k->integer == items[i]->integer && k->text == items[i]->text &&
          (k->kind == PickleKind::string || k->kind == PickleKind::integer)) {
        v = items[i + 1], replaced = true;
        break;
      }
    if (!replaced) entries.emplace_back(items[i], items[i + 1]);
  }
}

void Vm::append_items(std::vector<Mutable> items) {
  auto& l = top();
  if (l->kind != PickleKind::list && l->kind != PickleKind::set) fail(std::string("APPENDS on a ") + kind_name(l->kind));
  l->items.insert(l->items.end(), items.begin(), items.end());
}

void Vm::global(const std::string& name) {
  if (!known_globals().count(name))
    fail("global '" + name + "'" + " is not one a DeepSpeed checkpoint holds; refused (nothing is imported or called)");
  auto g = make(PickleKind::global);
  g->text = name;
  push(g);
}

bool Vm::step(unsigned char op) {
  switch (op) {
    case 0x80: unsigned_le(1); return true;         // PROTO
    case 0x95: unsigned_le(8); return true;         // FRAME: framing only
    case '.': return false;                         // STOP
    case '(': marks_.push_back(stack_.size()); return true;
    case '0': pop(); return true;                   // POP
    case '1': pop_mark(); return true;              // POP_MARK
    case '2': push(top()); return true;             // DUP
    case 'N': push(make(PickleKind::none)); return true;
    case 0x88: case 0x89: { auto b = make(PickleKind::boolean); b->boolean = op == 0x88; push(b); return true; }
    case 'J': integer(int32_t(uint32_t(unsigned_le(4)))); return true;  // BININT
    case 'K': integer(int64_t(unsigned_le(1))); return true;            // BININT1
    case 'M': integer(int64_t(unsigned_le(2))); return true;            // BININT2
    case 0x8a: long1(); return true;
    case 'G': binfloat(); return true;
    case 'X': { const auto n = unsigned_le(4); string(std::string(take(n), n)); return true; }   // BINUNICODE
    case 0x8c: { const auto n = unsigned_le(1); string(std::string(take(n), n)); return true; }  // SHORT_BINUNICODE
    case 0x8d: { const auto n = unsigned_le(8); string(std::string(take(n), n)); return true; }  // BINUNICODE8
    case 'T': { const auto n = unsigned_le(4); string(std::string(take(n), n)); return true; }   // BINSTRING
    case 'U': { const auto n = unsigned_le(1); string(std::string(take(n), n)); return true; }   // SHORT_BINSTRING
    case ')': tuple({}); return true;
    case 't': tuple(pop_mark()); return true;
    case 0x85: { auto a = pop(); tuple({a}); return true; }
    case 0x86: { auto b = pop(), a = pop(); tuple({a, b}); return true; }
    case 0x87: { auto c = pop(), b = pop(), a = pop(); tuple({a, b, c}); return true; }
    case ']': push(make(PickleKind::list)); return true;
    case 'l': { auto items = pop_mark(); push(make(PickleKind::list)); append_items(std::move(items)); return true; }
    case 'a': { auto v = pop(); append_items({v}); return true; }
    case 'e': append_items(pop_mark()); return true;
    case 0x8f: push(make(PickleKind::set)); return true;   // EMPTY_SET
    case 0x90: append_items(pop_mark()); return true;      // ADDITEMS
    case '}': push(make(PickleKind::dict)); return true;
    case 'd': { auto items = pop_mark(); push(make(PickleKind::dict)); set_items(std::move(items)); return true; }
    case 's': { auto v = pop(), k = pop(); set_items({k, v}); return true; }
    case 'u': set_items(pop_mark()); return true;
    case 'c': { auto module = line(); global(module + "." + line()); return true; }
    case 0x93: { auto name = pop(), module = pop();  // STACK_GLOBAL
      if (name->kind != PickleKind::string || module->kind != PickleKind::string) fail("STACK_GLOBAL of non-strings");
      global(module->text + "." + name->text); return true; }
    case 'R': reduce(); return true;
    case 0x81: newobj(); return true;
    case 'b': build(); return true;
    case 'Q': persistent_id(); return true;
    case 'q': put(unsigned_le(1)); return true;   // BINPUT
    case 'r': put(unsigned_le(4)); return true;   // LONG_BINPUT
    case 0x94: put(memo_.size()); return true;    // MEMOIZE
    case 'h': get(unsigned_le(1)); return true;   // BINGET
    case 'j': get(unsigned_le(4)); return true;   // LONG_BINGET
    default: break;
  }
  const char* name = refused_opcode_name(op);
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", unsigned(op));
  fail(std::string("opcode ") + (name ? name : "unknown") + " (" + hex + ") is not one this reader accepts; refused");
}

PickleRef Vm::run() {
  if (in_.empty()) fail("empty");
  for (;;) {
    op_at_ = at_;
    const auto op = static_cast<unsigned char>(*take(1));
    if (!step(op)) break;
  }
  if (stack_.size() != 1 || !marks_.empty()) fail("ends with " + std::to_string(stack_.size()) + " values on the stack");
  if (at_ != in_.size()) fail("has " + std::to_string(in_.size() - at_) + " bytes after STOP");
  return stack_.back();
}

// The calls a DeepSpeed pickle makes, each producing data (defined below).
Mutable call_known_global(const std::string& global, const PickleValue& args);

[[noreturn]] void refuse_call(const std::string& global, const PickleValue& args, const std::string& why) {
  throw CheckpointError("call of '" + global + "' " + why + " (arguments " + describe(args) + "); refused");
}

void Vm::reduce() {
  auto args = pop();
  auto callable = pop();
  if (callable->kind != PickleKind::global) fail(std::string("REDUCE of a ") + kind_name(callable->kind) + ", not a global");
  if (args->kind != PickleKind::tuple) fail("REDUCE with arguments that are not a tuple");
  try {
    push(call_known_global(callable->text, *args));
  } catch (const CheckpointError& e) {
    fail(e.what());
  }
}

void Vm::newobj() {
  auto args = pop();
  auto cls = pop();
  if (cls->kind != PickleKind::global || known_globals().at(cls->text).role != Global::ds_object)
    fail("NEWOBJ of '" + (cls->kind == PickleKind::global ? cls->text : std::string(kind_name(cls->kind))) +
         "': only DeepSpeed's loss scalers and fragment_address are built as objects; refused");
  auto obj = make(PickleKind::object);
  obj->text = cls->text;
  push(obj);
}

void Vm::build() {
  auto state = pop();
  auto& obj = top();
  // An OrderedDict's attributes (a state_dict's _metadata: module versions) are not its items.
  if (obj->kind == PickleKind::dict && state->kind == PickleKind::dict) return;
  if (obj->kind != PickleKind::object) fail(std::string("BUILD on a ") + kind_name(obj->kind) + "; refused");
  if (state->kind != PickleKind::dict) fail("BUILD of " + obj->text + " with a state that is not a dict");
  obj->entries.insert(obj->entries.end(), state->entries.begin(), state->entries.end());
}

// torch.save's persistent id of a storage: ('storage', <storage type>, key, location, elements).
void Vm::persistent_id() {
  auto pid = pop();
  const auto& t = pid->items;
  if (pid->kind != PickleKind::tuple || t.size() != 5 || t[0]->kind != PickleKind::string || t[0]->text != "storage" ||
      t[1]->kind != PickleKind::global || t[2]->kind != PickleKind::string || t[4]->kind != PickleKind::integer)
    fail("persistent id " + describe(*pid) + " is not a torch.save storage");
  const auto& g = known_globals().at(t[1]->text);
  if (g.role != Global::storage) fail("persistent id with type '" + t[1]->text + "', not a storage type");
  if (t[4]->integer < 0) fail("storage of " + std::to_string(t[4]->integer) + " elements");
  auto s = make(PickleKind::storage);
  s->storage = {t[2]->text, g.dtype, t[4]->integer};
  push(s);
}

// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
Mutable rebuild_tensor_v2(const std::string& global, const PickleValue& args) {
  const auto& a = args.items;
  auto refuse = [&](const std::string& why) -> Mutable { refuse_call(global, args, why); };
  if (a.size() < 6 || a.size() > 7 || a[0]->kind != PickleKind::storage || a[1]->kind != PickleKind::integer ||
      a[2]->kind != PickleKind::tuple || a[3]->kind != PickleKind::tuple || a[2]->items.size() != a[3]->items.size())
    return refuse("with unexpected arguments");
  auto t = make(PickleKind::tensor);
  t->tensor.storage = a[0]->storage;
  t->tensor.offset = a[1]->integer;
  int64_t last = t->tensor.offset;
  for (size_t k = 0; k < a[2]->items.size(); ++k) {
    const auto& size = *a[2]->items[k];
    const auto& stride = *a[3]->items[k];
    if (size.kind != PickleKind::integer || stride.kind != PickleKind::integer || size.integer < 0 || stride.integer < 0)
      return refuse("with a bad size or stride");
    t->tensor.shape.push_back(size.integer);
    t->tensor.strides.push_back(stride.integer);
    if (size.integer == 0) last = -1;
    else if (last >= 0) last += (size.integer - 1) * stride.integer;
  }
  if (t->tensor.offset < 0 || (last >= 0 && last >= a[0]->storage.elements))
    return refuse("reaching outside its storage of " + std::to_string(a[0]->storage.elements) + " elements");
  return t;
}


Mutable call_known_global(const std::string& global, const PickleValue& args) {
  const auto& a = args.items;
  const auto role = known_globals().at(global).role;
  auto refuse = [&](const std::string& why) -> Mutable { refuse_call(global, args, why); };
  switch (role) {
    case Global::ordered_dict: {
      auto d = make(PickleKind::dict);
      if (a.empty()) return d;
      if (a.size() == 1 && (a[0]->kind == PickleKind::list || a[0]->kind == PickleKind::tuple)) {
        for (const auto& pair : a[0]->items) {
          if (pair->kind != PickleKind::tuple || pair->items.size() != 2) return refuse("with items that are not pairs");
          d->entries.emplace_back(pair->items[0], pair->items[1]);
        }
        return d;
      }
      return refuse("with unexpected arguments");
    }
    case Global::set: {
      auto s = make(PickleKind::set);
      if (a.empty()) return s;
      if (a.size() == 1 && (a[0]->kind == PickleKind::list || a[0]->kind == PickleKind::tuple)) {
        s->items = a[0]->items;
        return s;
      }
      return refuse("with unexpected arguments");
    }
    case Global::size: {
      if (a.size() != 1 || a[0]->kind != PickleKind::tuple) return refuse("without one tuple");
      for (const auto& d : a[0]->items)
        if (d->kind != PickleKind::integer) return refuse("with a dimension that is not an int");
      auto t = make(PickleKind::tuple);
      t->items = a[0]->items;
      return t;
    }
    case Global::getattr:  // getattr(ZeroStageEnum, 'name'): how newer Pythons pickle an enum member
      if (a.size() != 2 || a[0]->kind != PickleKind::global || known_globals().at(a[0]->text).role != Global::zero_stage_enum ||
          a[1]->kind != PickleKind::string)
        return refuse("other than on ZeroStageEnum with a name");
      if (!zero_stages().count(a[1]->text)) return refuse("with an unknown member");
      {
        auto e = make(PickleKind::enum_member);
        e->text = a[0]->text + "." + a[1]->text, e->integer = zero_stages().at(a[1]->text);
        return e;
      }
    case Global::zero_stage_enum: {  // ZeroStageEnum(value)
      if (a.size() != 1 || a[0]->kind != PickleKind::integer) return refuse("without one int");
      for (const auto& [name, value] : zero_stages())
        if (value == a[0]->integer) {
          auto e = make(PickleKind::enum_member);
          e->text = global + "." + name, e->integer = value;
          return e;
        }
      return refuse("with an unknown value");
    }
    case Global::rebuild_tensor: return rebuild_tensor_v2(global, args);
    default: return refuse("is not a function this reader evaluates");
  }
}

}  // namespace

PickleRef unpickle(std::string_view bytes, const std::string& where) { return Vm(bytes, where).run(); }

}  // namespace tessera::checkpoint::deepspeed
