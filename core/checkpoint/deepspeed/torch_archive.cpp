// The one LibTorch dependency of the DeepSpeed importer: the zip reader. The pickle is ours.
#include "core/checkpoint/deepspeed/torch_archive.h"

#include <caffe2/serialize/inline_container.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "core/checkpoint/deepspeed/restricted_unpickler.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace tessera::checkpoint::deepspeed {

struct TorchArchive::Records {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  std::map<std::string, std::pair<at::DataPtr, size_t>> storages;  // by record name
};

namespace {

// The first line of a c10::Error (the rest is a C++ backtrace).
std::string first_line(const c10::Error& e) {
  std::string m = e.what_without_backtrace();
  const auto nl = m.find('\n');
  return nl == std::string::npos ? m : m.substr(0, nl);
}

}  // namespace

TorchArchive::TorchArchive(const std::string& path) : path_(path), records_(std::make_unique<Records>()) {
  if (!fs::is_regular_file(path)) throw CheckpointError(path + ": missing (or not a regular file)");
  try {
    records_->reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
    if (!records_->reader->hasRecord("data.pkl"))
      throw CheckpointError(path + ": a zip archive without data.pkl (not written by torch.save)");
    auto [data, size] = records_->reader->getRecord("data.pkl");
    root_ = unpickle(std::string_view(static_cast<const char*>(data.get()), size), path);
  } catch (const c10::Error& e) {
    throw CheckpointError(path + ": not a readable torch.save archive (truncated or corrupt?): " + first_line(e));
  }
}

TorchArchive::~TorchArchive() = default;

std::vector<char> TorchArchive::read(const TensorRef& t, const std::string& what) const {
  const std::string record = "data/" + t.storage.key;
  const int64_t element = affine::element_size(t.storage.dtype);
  auto it = records_->storages.find(record);
  if (it == records_->storages.end()) {
    try {
      if (!records_->reader->hasRecord(record))
        throw CheckpointError(path_ + ": tensor '" + what + "': record " + record + " is missing");
      auto [data, size] = records_->reader->getRecord(record);
      it = records_->storages.emplace(record, std::make_pair(std::move(data), size)).first;
    } catch (const c10::Error& e) {
      throw CheckpointError(path_ + ": tensor '" + what + "': record " + record + " unreadable: " + first_line(e));
    }
  }
  const auto& [data, size] = it->second;
  if (int64_t(size) != t.storage.elements * element)
    throw CheckpointError(path_ + ": tensor '" + what + "': record " + record + " holds " + std::to_string(size) +
                          " bytes, its storage " + std::to_string(t.storage.elements * element));
  const auto* base = static_cast<const char*>(data.get());
  std::vector<char> out(size_t(t.elements() * element));
  if (out.empty()) return out;
  if (t.contiguous()) {
    std::memcpy(out.data(), base + t.offset * element, out.size());
    return out;
  }
  // A strided view (DeepSpeed saves none; torch.save may): element by element, row-major.
  std::vector<int64_t> index(t.shape.size(), 0);
  for (int64_t i = 0; i < t.elements(); ++i) {
    int64_t address = t.offset;
    for (size_t k = 0; k < index.size(); ++k) address += index[k] * t.strides[k];
    std::memcpy(out.data() + i * element, base + address * element, size_t(element));
    for (size_t k = index.size(); k-- > 0;) {
      if (++index[k] < t.shape[k]) break;
      index[k] = 0;
    }
  }
  return out;
}

}  // namespace tessera::checkpoint::deepspeed
