// pytorch_bin_writer: the one file of core/checkpoint that uses LibTorch, for its zip writer
// (PyTorchStreamWriter writes record by record through a callback; torch::pickle_save and
// torch::save build the whole archive in memory first).
//
// The layout is torch.save's (torch/serialization.py, _save): data.pkl pickles, at protocol 2,
//   OrderedDict([(name, _rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict())), ...])
// where each storage is a persistent id ('storage', torch.FloatStorage, '<i>', 'cpu', numel) whose
// bytes are the record data/<i>; torch.load resolves the ids to those records.
#include <caffe2/serialize/inline_container.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/checkpoint/tensor_file_writer.h"
#include "core/error.h"

namespace tessera::checkpoint {
namespace {

// Pickle protocol 2 opcodes (Lib/pickle.py).
constexpr char kProto = '\x80', kGlobal = 'c', kEmptyTuple = ')', kReduce = 'R', kMark = '(', kTuple = 't',
               kBinUnicode = 'X', kBinInt1 = 'K', kBinInt2 = 'M', kBinInt = 'J', kLong1 = '\x8a', kBinPersId = 'Q',
               kNewFalse = '\x89', kSetItems = 'u', kStop = '.';
constexpr size_t kBatch = 1000;  // SETITEMS batches, as Python's pickler cuts them

class Pickle {
 public:
  void op(char code) { out_.push_back(code); }
  void global(const char* module, const char* name) {
    op(kGlobal);
    out_ += std::string(module) + "\n" + name + "\n";
  }
  void unicode(const std::string& text) {
    op(kBinUnicode);
    little_endian(uint64_t(text.size()), 4);
    out_ += text;
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op(kBinInt1), little_endian(uint64_t(v), 1);
    } else if (v >= 0 && v < 65536) {
      op(kBinInt2), little_endian(uint64_t(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op(kBinInt), little_endian(uint64_t(v), 4);
    } else {  // two's complement, 8 bytes
      op(kLong1), out_.push_back(char(8)), little_endian(uint64_t(v), 8);
    }
  }
  void tuple(const std::vector<int64_t>& values) {
    if (values.empty()) return op(kEmptyTuple);
    op(kMark);
    for (int64_t v : values) integer(v);
    op(kTuple);
  }
  void empty_ordered_dict() {
    global("collections", "OrderedDict");
    op(kEmptyTuple), op(kReduce);
  }
  std::string take() { return std::move(out_); }

 private:
  void little_endian(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(char((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

const char* storage_type(affine::DType dtype) {
  switch (dtype) {
    case affine::DType::f32: return "FloatStorage";
    case affine::DType::f16: return "HalfStorage";
    case affine::DType::bf16: return "BFloat16Storage";
    case affine::DType::f64: return "DoubleStorage";
    case affine::DType::i8: return "CharStorage";
    case affine::DType::u8: return "ByteStorage";
    case affine::DType::i16: return "ShortStorage";
    case affine::DType::i32: return "IntStorage";
    case affine::DType::i64: return "LongStorage";
    case affine::DType::bool8: return "BoolStorage";
  }
  return "?";
}

// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks)
void pickle_tensor(Pickle& p, const OutputTensor& t, size_t key) {
  p.global("torch._utils", "_rebuild_tensor_v2");
  p.op(kMark);
  p.op(kMark);  // the persistent id of the storage: record data/<key>
  p.unicode("storage");
  p.global("torch", storage_type(t.dtype));
  p.unicode(std::to_string(key));
  p.unicode("cpu");
  p.integer(t.shape.product());
  p.op(kTuple);
  p.op(kBinPersId);
  p.integer(0);
  p.tuple(t.shape.to_vector());
  p.tuple(affine::row_major_strides(t.shape).to_vector());
  p.op(kNewFalse);
  p.empty_ordered_dict();
  p.op(kTuple);
  p.op(kReduce);
}

std::string pickle_state_dict(const std::vector<OutputTensor>& tensors) {
  Pickle p;
  p.op(kProto), p.op(char(2));
  p.empty_ordered_dict();
  for (size_t begin = 0; begin < tensors.size(); begin += kBatch) {
    p.op(kMark);
    for (size_t i = begin; i < std::min(tensors.size(), begin + kBatch); ++i) {
      p.unicode(tensors[i].name);
      pickle_tensor(p, tensors[i], i);
    }
    p.op(kSetItems);
  }
  p.op(kStop);
  return p.take();
}

class PytorchBinWriter final : public TensorFileWriter {
 public:
  PytorchBinWriter(const std::string& path, const std::vector<OutputTensor>& tensors)
      : order_(path, tensors), file_(path), zip_([this](const void* data, size_t n) { return sink(data, n); }) {
    const auto pickle = pickle_state_dict(tensors);
    record("data.pkl", pickle.data(), pickle.size());
    record("byteorder", "little", 6);  // torch.save >= 2.1 writes it; older torch.load ignores it
  }
  ~PytorchBinWriter() override { discard_ = true; }  // ~PyTorchStreamWriter finishes into nothing
  void write(const std::string& name, const void* data, int64_t bytes) override {
    const size_t key = size_t(&order_.next(name, bytes) - order_.tensors().data());
    record("data/" + std::to_string(key), data, size_t(bytes));
  }
  void finish() override {
    if (!order_.done()) throw CheckpointError(file_.path() + ": finished before its last tensor was written");
    try {
      zip_.writeEndOfFile();  // the version record and the central directory
    } catch (const c10::Error& e) {
      throw CheckpointError(file_.path() + ": the zip archive cannot be finished: " + e.what_without_backtrace());
    }
    rethrow();
    file_.sync_and_close();
  }

 private:
  // The zip writer's only way out; a failed write is kept and raised after the call returns (the
  // writer must not see a short write: its destructor would then throw).
  size_t sink(const void* data, size_t n) {
    if (discard_ || !error_.empty()) return n;
    try {
      file_.write(data, n);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    return n;
  }
  void rethrow() const {
    if (!error_.empty()) throw CheckpointError(error_);
  }
  void record(const std::string& name, const void* data, size_t bytes) {
    try {
      zip_.writeRecord(name, data, bytes);
    } catch (const c10::Error& e) {
      throw CheckpointError(file_.path() + ": record '" + name + "' cannot be written: " + e.what_without_backtrace());
    }
    rethrow();
  }

  TensorOrder order_;
  OutputFile file_;
  std::string error_;
  bool discard_ = false;
  caffe2::serialize::PyTorchStreamWriter zip_;  // last: destroyed first, while file_ is open
};

}  // namespace

std::unique_ptr<TensorFileWriter> pytorch_bin_writer(const std::string& path, const std::vector<OutputTensor>& tensors) {
  return std::make_unique<PytorchBinWriter>(path, tensors);
}

}  // namespace tessera::checkpoint
