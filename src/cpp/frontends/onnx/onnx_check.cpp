// The ONNX frontend's check of a model before an engine reads it, and its external-data reader. See onnx_check.h.
//
// Note [External data stays inside the model's folder]
// As ONNX Runtime does, an external-data location must name a file inside the model's folder: absolute paths, ".."
// components and symbolic links that resolve outside it are refused, and offset and length are checked against the
// file before anything is allocated or read. A model given as bytes has no folder: it reads no file unless the
// caller names one (SessionOptions::model_dir, Python's external_data_dir=). The native import reads the files
// through open_external and read_external; the onnxruntime engine runs the same checks (check_external_data) before
// ONNX Runtime reads anything.
//
// Note [External data files are opened, not followed]
// The location is resolved first (symbolic links inside the folder that stay inside it are allowed, as ONNX Runtime
// allows them), then the resolved path is opened one component at a time from the folder with openat and
// O_NOFOLLOW: a link that appears between the check and the open (a swapped component) fails the open instead of
// leading outside. The file is opened O_NONBLOCK, so a FIFO does not block session creation waiting for a writer
// (with std::ifstream it did, forever), and the opened descriptor must be a regular file (fstat, not stat of the
// path: what is checked is what is read): FIFOs, devices, sockets and directories are InvalidArgumentErrors saying
// which. Offset and length are checked against fstat's size, and exactly `length` bytes are read with pread in a
// loop (short reads continue; a file that ends early is an error, never uninitialised bytes), straight into the
// tensor.
#include "frontends/onnx/onnx_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>
#include <vector>

#include "frontends/onnx/onnx_validate.h"
#include "xpuruntime/dtype.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/onnx_dtype.h"

namespace xpuruntime::onnx_frontend {
namespace {

// A non-negative decimal integer of an external_data entry.
std::int64_t external_int(const std::string& text, const char* key, const std::string& where) {
  std::int64_t value = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  XPURT_CHECK(error == std::errc() && end == text.data() + text.size() && value >= 0, where, ": external data ",
              key, " '", text, "' is not a non-negative integer");
  return value;
}

using detail::file_kind;
using detail::open_at;
using detail::pread_fully;
using detail::UniqueFd;

// Opens `base / inside` (`inside`: resolved, relative, no "." or "..") component by component without following
// any symbolic link (Note [External data files are opened, not followed]).
UniqueFd open_inside(const std::filesystem::path& base, const std::filesystem::path& inside, const std::string& shown,
                     const std::string& where) {
  UniqueFd dir(open_at(AT_FDCWD, base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  XPURT_CHECK(dir.get() >= 0, where, ": the model's folder '", base.string(), "' cannot be opened: ",
              std::strerror(errno));
  std::vector<std::filesystem::path> parts(inside.begin(), inside.end());
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const bool last = i + 1 == parts.size();
    const int flags = last ? O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC
                           : O_RDONLY | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC;
    UniqueFd next(open_at(dir.get(), parts[i].c_str(), flags));
    if (next.get() < 0) {
      const int error = errno;
      XPURT_CHECK(error != ELOOP && !(error == ENOTDIR && !last), where, ": external data file '", shown,
                  "': '", parts[i].string(), "' became a symbolic link or stopped being a folder while it was opened; "
                  "it is not followed (Note [External data files are opened, not followed])");
      XPURT_CHECK(false, where, ": cannot open external data file '", shown, "': ", std::strerror(error));
    }
    dir = std::move(next);
  }
  return dir;
}

// Checks the external data of every tensor below `graph` (and of the attributes of `nodes`); returns how many.
std::size_t check_external_nodes(const google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes,
                                 const std::string& model_dir);

// The byte size a tensor's type and shape declare; unset for element types xpuruntime tensors do not hold (the
// engine's library checks those) and for shapes the native import refuses (negative, overflowing).
std::optional<std::size_t> declared_bytes(const onnx::TensorProto& proto) {
  DType dtype;
  if (!proto.has_data_type() || !dtype_from_onnx_type(proto.data_type(), &dtype)) return std::nullopt;
  std::int64_t bytes = static_cast<std::int64_t>(dtype_size(dtype));
  for (std::int64_t d : proto.dims()) {
    if (d < 0 || (d != 0 && bytes > std::numeric_limits<std::int64_t>::max() / d)) return std::nullopt;
    bytes *= d;
  }
  // int4/uint4 lie in the file two per byte (Note [Float8 and 4-bit dtypes], xpuruntime/low_bit.h).
  if (is_int4_dtype(dtype)) return static_cast<std::size_t>((bytes + 1) / 2);
  return static_cast<std::size_t>(bytes);
}

std::size_t check_external_tensor(const onnx::TensorProto& proto, const std::string& model_dir) {
  if (proto.data_location() != onnx::TensorProto::EXTERNAL) return 0;
  open_external(proto, model_dir, declared_bytes(proto), detail::str_cat("tensor '", proto.name(), "'"));
  return 1;
}

std::size_t check_external_graph(const onnx::GraphProto& graph, const std::string& model_dir) {
  std::size_t count = 0;
  for (const auto& t : graph.initializer()) count += check_external_tensor(t, model_dir);
  for (const auto& s : graph.sparse_initializer()) {
    count += check_external_tensor(s.values(), model_dir) + check_external_tensor(s.indices(), model_dir);
  }
  return count + check_external_nodes(graph.node(), model_dir);
}

std::size_t check_external_nodes(const google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes,
                                 const std::string& model_dir) {
  std::size_t count = 0;
  for (const auto& node : nodes) {
    for (const auto& attr : node.attribute()) {
      if (attr.has_t()) count += check_external_tensor(attr.t(), model_dir);
      for (const auto& t : attr.tensors()) count += check_external_tensor(t, model_dir);
      if (attr.has_sparse_tensor()) {
        count += check_external_tensor(attr.sparse_tensor().values(), model_dir) +
                 check_external_tensor(attr.sparse_tensor().indices(), model_dir);
      }
      if (attr.has_g()) count += check_external_graph(attr.g(), model_dir);
      for (const auto& g : attr.graphs()) count += check_external_graph(g, model_dir);
    }
  }
  return count;
}

}  // namespace

ExternalSpan open_external(const onnx::TensorProto& proto, const std::string& model_dir,
                           std::optional<std::size_t> nbytes, const std::string& where) {
  std::string location;
  std::int64_t offset = 0;
  std::int64_t length = -1;
  for (const auto& entry : proto.external_data()) {
    if (entry.key() == "location") location = entry.value();
    if (entry.key() == "offset") offset = external_int(entry.value(), "offset", where);
    if (entry.key() == "length") length = external_int(entry.value(), "length", where);
  }
  XPURT_CHECK(!location.empty(), where, ": external data without a location");
  XPURT_CHECK(!model_dir.empty(), where, ": external data in '", location,
              "', but the model was given as bytes with no folder to read it from (pass the model's path, or name "
              "the folder: SessionOptions::model_dir, external_data_dir= in Python)");
  const std::filesystem::path rel(location);
  XPURT_CHECK(!rel.is_absolute() && !rel.has_root_name() && !rel.has_root_directory(), where,
              ": external data location '", location, "' is an absolute path; it must be relative to the model's "
              "folder");
  for (const auto& part : rel.lexically_normal()) {
    XPURT_CHECK(part != "..", where, ": external data location '", location, "' leaves the model's folder ('..')");
  }
  std::error_code ec;
  const std::filesystem::path base = std::filesystem::weakly_canonical(model_dir, ec);
  XPURT_CHECK(!ec, where, ": the model's folder '", model_dir, "' cannot be resolved: ", ec.message());
  const std::filesystem::path path = std::filesystem::weakly_canonical(base / rel, ec);
  XPURT_CHECK(!ec, where, ": external data location '", location, "' cannot be resolved: ", ec.message());
  const auto inside = std::mismatch(base.begin(), base.end(), path.begin(), path.end());
  XPURT_CHECK(inside.first == base.end(), where, ": external data location '", location, "' resolves to '",
              path.string(), "', outside the model's folder '", base.string(), "' (a symbolic link?)");
  std::filesystem::path rest;
  for (auto it = inside.second; it != path.end(); ++it) {
    if (!it->empty()) rest /= *it;  // a trailing separator is an empty component
  }
  ExternalSpan span;
  span.path = path.string();
  span.file = open_inside(base, rest, span.path, where);
  struct stat info {};
  XPURT_CHECK(::fstat(span.file.get(), &info) == 0, where, ": cannot stat external data file '", span.path, "': ",
              std::strerror(errno));
  XPURT_CHECK(S_ISREG(info.st_mode), where, ": external data file '", span.path, "' is ", file_kind(info.st_mode),
              ", not a regular file (external data is read from regular files only)");
  const std::int64_t size = info.st_size;
  XPURT_CHECK(offset <= size, where, ": external data offset ", offset, " is outside the file '", span.path, "' (",
              size, " bytes)");
  if (length < 0) length = nbytes ? static_cast<std::int64_t>(*nbytes) : size - offset;
  XPURT_CHECK(!nbytes || length == static_cast<std::int64_t>(*nbytes), where, ": external data length ", length,
              " does not match the tensor's ", nbytes.value_or(0), " bytes");
  XPURT_CHECK(length <= size - offset, where, ": external data of ", length, " bytes at offset ", offset,
              " is outside the file '", span.path, "' (", size, " bytes)");
  span.offset = offset;
  span.length = length;
  return span;
}

// Reads exactly span.length bytes into `dst` (Note [External data files are opened, not followed]).
void read_external(const ExternalSpan& span, void* dst, const std::string& where) {
  const std::int64_t done = pread_fully(span.file.get(), static_cast<char*>(dst), span.length, span.offset,
                                        where + ": reading external data from '" + span.path + "'");
  XPURT_CHECK(done == span.length, where, ": external data file '", span.path, "' ended after ", done, " of the ",
              span.length, " bytes at offset ", span.offset, " (did it shrink while being read?)");
}

void parse_checked(const std::string& model_bytes, bool allow_newer_opsets, onnx::ModelProto* model) {
  XPURT_CHECK(!model_bytes.empty(), "invalid model: the model is empty (0 bytes)");
  XPURT_CHECK(model_bytes.size() < static_cast<std::size_t>(std::numeric_limits<int>::max()),
              "invalid model: ", model_bytes.size(), " bytes exceed protobuf's 2 GB limit (use external data)");
  XPURT_CHECK(model->ParseFromArray(model_bytes.data(), static_cast<int>(model_bytes.size())),
              "invalid model: the bytes are not a valid ONNX ModelProto (", model_bytes.size(),
              " bytes; truncated or not an ONNX file?)");
  XPURT_CHECK(model->has_graph(), "invalid model: the ModelProto has no graph");
  XPURT_CHECK(model->ir_version() >= 3, "invalid model: IR version ", model->ir_version(),
              " is not supported (3 or newer)");
  XPURT_CHECK(model->opset_import_size() > 0, "invalid model: no opset_import");
  detail::validate_onnx_model(*model, {allow_newer_opsets});
}

std::size_t check_external_data(const onnx::ModelProto& model, const std::string& model_dir) {
  std::size_t count = check_external_graph(model.graph(), model_dir);
  for (const auto& function : model.functions()) count += check_external_nodes(function.node(), model_dir);
  return count;
}

void validate_onnx(const std::string& model_bytes, const CheckOptions& options, onnx::ModelProto* model) {
  parse_checked(model_bytes, options.allow_newer_opsets, model);
  check_external_data(*model, options.model_dir);  // on the same parse
}

}  // namespace xpuruntime::onnx_frontend
