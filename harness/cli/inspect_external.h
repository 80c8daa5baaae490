// `inspect PATH` on what is not one of the tool's own checkpoints: a torch.save file, a directory
// of them, a torch.distributed.checkpoint directory or safetensors files, listed as the external
// trainer check reads them (verify/external_checkpoints.h, untrusted: no torch loader sees the
// file). Lives in the CLI layer so that the checkpoint room never learns about the verify room.
#pragma once
#include <ostream>
#include <string>

namespace rh {

// True when `path` is for inspect_external rather than ckpt::inspect_checkpoint: a regular file,
// or a directory without manifest.json that holds a torch-like (.pt, .distcp, ...), DCP
// (.metadata) or .safetensors file. A directory with the tool's pointer file or an iter_ name
// stays the tool's (its damage is exit 1) unless a torch-like file lies below it (a Megatron root).
bool is_external_checkpoint(const std::string& path);

// Prints a header naming the path and its format, every tensor (key, dtype, shape, bytes; sorted
// by key), every non-tensor value (key and its exact text, cut at 80 characters), and totals.
// Returns 0; 2 with one `resume-harness: error: PATH: ...` line for an unreadable or hostile
// checkpoint. quiet: nothing on success, the error line alone on failure. The bridge's flat file
// goes to a fresh directory under $TMPDIR (or /tmp), removed before returning.
int inspect_external(const std::string& path, std::ostream& out, bool quiet);

}   // namespace rh
