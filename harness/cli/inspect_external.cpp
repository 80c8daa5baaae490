// inspect of a third-party checkpoint through external::CheckpointReader; see inspect_external.h.
#include "harness/cli/inspect_external.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/base/text.h"
#include "harness/base/version.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/manifest.h"
#include "harness/checkpoint/safetensors_format.h"
#include "harness/verify/external.h"
#include "harness/verify/external_checkpoints.h"

namespace fs = std::filesystem;

namespace rh {

namespace {

constexpr size_t kMaxValueText = 80;   // a value's text is cut here, with "..."

// The extensions CheckpointReader's "auto" format takes for torch files (external_checkpoints.cpp).
bool torch_like(const fs::path& p) {
  for (const char* x : {".pt", ".pth", ".bin", ".ckpt", ".distcp", ".pkl"})
    if (p.extension() == x) return true;
  return false;
}

// What a directory holds, walked without following links (the reader refuses them itself).
struct DirContents {
  bool dcp = false;           // a top-level .metadata: torch.distributed.checkpoint
  bool torch = false;         // a torch-like file anywhere below
  bool safetensors = false;   // a .safetensors file anywhere below
};

DirContents dir_contents(const fs::path& dir) {
  DirContents c;
  std::error_code ec;
  c.dcp = fs::is_regular_file(fs::symlink_status(dir / ".metadata", ec));
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    c.torch = c.torch || torch_like(it->path());
    c.safetensors = c.safetensors || it->path().extension() == ".safetensors";
  }
  return c;
}

// The header's name for the format, and what an unreadable one was expected to be.
struct Format {
  const char* name;
  const char* expected;
};

Format format_of(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_directory(p, ec)) {
    if (p.extension() == ".safetensors") return {"safetensors file", "a safetensors file"};
    return {"torch file", "a torch.save file (zip format, torch >= 1.6)"};
  }
  const DirContents c = dir_contents(p);
  if (c.dcp) return {"DCP directory", "a torch.distributed.checkpoint directory (.metadata and *.distcp)"};
  if (c.torch) return {"torch directory", "a directory of torch.save files"};
  return {"safetensors directory", "a directory of safetensors files"};
}

// A fresh directory for the bridge's flat file, removed when this goes (also on error). The
// reader wants its scratch at <cell>/flat and walks from two levels above the scratch without
// following links, so that is this directory: <tmp>/rh-inspect-XXXXXX/cell/flat.
class ScratchDir {
 public:
  ScratchDir() {
    const char* t = std::getenv("TMPDIR");
    std::string templ = ((t && *t) ? fs::path(t) : fs::path("/tmp")) / "rh-inspect-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr)
      throw std::runtime_error(templ + ": cannot create a temporary directory (set TMPDIR to a writable one)");
    root_ = templ;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(root_, ec);   // our own 0700 directory; remove_all does not follow links
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  fs::path scratch() const { return root_ / "cell" / "flat"; }

 private:
  fs::path root_;
};

// One line of the listing: control characters as \xNN (a value's newline stays on its row), bytes
// that are not UTF-8 likewise; longer than kMaxValueText characters cut, with "...".
std::string shown_text(const std::string& text) {
  std::string s = printable_text(quote_text(text, text.size() * 4 + 16));
  size_t chars = 0, cut = s.size();
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;   // a UTF-8 continuation byte
    if (chars++ == kMaxValueText) {
      cut = i;
      break;
    }
  }
  return cut < s.size() ? s.substr(0, cut) + "..." : s;
}

std::string shape_text(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
  return s + "]";
}

// The bridge's dtype names for what safetensors stores as bytes, in the table's (safetensors') style.
std::string st_style(const std::string& bridge_dtype) {
  static const std::map<std::string, std::string> names = {
      {"bool", "BOOL"}, {"int8", "I8"}, {"uint16", "U16"}, {"uint32", "U32"}, {"uint64", "U64"}};
  auto it = names.find(bridge_dtype);
  return it == names.end() ? printable_text(bridge_dtype) : it->second;
}

void print_flat(const std::string& path, const Format& format, const external::Flat& flat, std::ostream& out) {
  out << printable_text(path) << " (" << format.name << ", read as the external-trainer check reads it)\n";
  // The bridge stores bool, int8 and unsigned numpy tensors as bytes of the same width and names
  // their dtype in a leaf "<key> (dtype)": the table shows that dtype, the values leave it out.
  auto dtype_leaf = [&flat](const std::string& key) -> const std::string* {
    auto it = flat.leaves.find(key + " (dtype)");
    return it == flat.leaves.end() ? nullptr : &it->second;
  };
  // The key column as wide as the longest key (a Megatron directory's keys carry their file path).
  size_t width = 48;
  for (const auto& [key, tensor] : flat.tensors) width = std::max(width, printable_text(key).size() + 2);
  for (const auto& [key, text] : flat.leaves) width = std::max(width, printable_text(key).size() + 3);
  const int kw = static_cast<int>(width);
  out << std::left << std::setw(kw) << "key" << std::setw(9) << "dtype" << std::setw(18) << "shape" << std::right
      << std::setw(12) << "bytes" << '\n';
  uint64_t elements = 0, bytes = 0;
  for (const auto& [key, tensor] : flat.tensors) {   // a std::map: sorted by key
    const std::string* real = dtype_leaf(key);
    const uint64_t nbytes = tensor.second.nbytes();
    elements += static_cast<uint64_t>(tensor.second.numel());
    bytes += nbytes;
    out << std::left << std::setw(kw) << printable_text(key) << std::setw(9)
        << (real ? st_style(*real) : ckpt::st_name(tensor.first)) << std::setw(18) << shape_text(tensor.second) << std::right
        << std::setw(12) << nbytes << '\n';
  }
  size_t values = 0;
  std::ostringstream rows;
  for (const auto& [key, text] : flat.leaves) {
    const std::string suffix = " (dtype)";
    if (key.size() > suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        flat.tensors.count(key.substr(0, key.size() - suffix.size())))
      continue;
    ++values;
    rows << "  " << std::left << std::setw(kw - 3) << printable_text(key) << ' ' << shown_text(text) << '\n';
  }
  out << "values (key, exact text):\n" << rows.str();
  out << "total " << flat.tensors.size() << (flat.tensors.size() == 1 ? " tensor, " : " tensors, ") << elements
      << " elements, " << bytes << " bytes; " << values << (values == 1 ? " value\n" : " values\n");
}

}   // namespace

bool is_external_checkpoint(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  const auto st = fs::status(p, ec);
  if (ec || !fs::exists(st)) return false;   // inspect_checkpoint names what is missing
  if (fs::is_regular_file(st)) return true;
  if (!fs::is_directory(st) || fs::exists(p / ckpt::detail::kManifestFile, ec)) return false;
  const DirContents c = dir_contents(p);
  const bool own_shape = fs::exists(p / ckpt::detail::kPointerFile, ec) ||
                         fs::absolute(p).lexically_normal().filename().string().rfind("iter_", 0) == 0;
  if (own_shape) return c.torch || c.dcp;   // the tool never writes those; Megatron does
  return c.dcp || c.torch || c.safetensors;
}

int inspect_external(const std::string& path, std::ostream& out, bool quiet) {
  // The path the user named, links followed (as `cat` would); below it the reader follows none.
  std::error_code ec;
  const fs::path given = fs::absolute(path).lexically_normal();
  fs::path real = fs::canonical(given, ec);
  if (ec) real = given;
  const Format format = format_of(real);
  try {
    const ExternalTrainer trainer;   // format "auto", trust_pickle false
    const ScratchDir tmp;
    external::CheckpointReader reader(trainer, tmp.scratch());
    const auto flat = reader.read({real}, "inspect");
    if (!quiet) print_flat(path, format, flat.front(), out);
    return 0;
  } catch (const DiskError&) {
    throw;   // the disk, not the checkpoint: tool_main's exit 4
  } catch (const std::exception& e) {
    std::string why = e.what();
    for (const std::string prefix : {"cannot read torch checkpoint: "})
      if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
    out << kErrorPrefix << printable_text(path) << ": expected " << format.expected << ": "
        << printable_text(quote_text(why, 600)) << "\n";
    return 2;
  }
}

}   // namespace rh
