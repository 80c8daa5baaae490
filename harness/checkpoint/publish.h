// Internal to the checkpoint room: the atomic publish protocol of a checkpoint directory, apart
// from what goes into it (save.cpp). Crash safety rests on two facts: a published iter_ directory
// is only ever produced by a rename of a complete, fsynced directory, and the pointer is replaced
// atomically after that.
//
// Re-saving an iteration that already exists: the new directory is swapped in with one
// renameat2(RENAME_EXCHANGE) and the old one (now under the temp name) is deleted afterwards. Where
// the file system cannot exchange, the old one is renamed aside to .old.iter_X.<pid> first; a
// crash between the two renames leaves it there, complete, and load (resolve_checkpoint_dir) and
// the next save (clean_stale) find it.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rh::ckpt::detail {

// Removes abandoned temp/aside directories of root. An aside directory whose iteration has no
// published directory is the only copy of that checkpoint (crash between renames): it is renamed
// back.
void clean_stale(const std::string& root);
// Removes only the temp entries of savers that no longer run (a kill mid-save leaves them): the
// .tmp.iter_<N>.<pid> directories and the pointer's <pointer>.tmp.<pid> file, nothing else.
// Load calls it on a root as well as save (best effort: a read-only root keeps them).
void clean_temps(const std::string& root);

// Creates root if needed, cleans it (clean_stale) and makes a fresh temp directory for iteration
// directory `name`: root/.tmp.<name>.<pid>. tmp_name is set before the directory is made, so that
// on failure the caller removes what was made. Throws CheckpointError (DiskError for the disk).
void make_temp_dir(const std::string& root, const std::string& name, std::string& tmp_name);

// Writes `files` (name, text) durably into the temp directory, fsyncs it, renames it into
// root/name (an exchange or a rename aside for a re-save) and then writes the pointer naming
// `iteration`. A new directory that the pointer could not be made to name is removed again.
void publish_dir(const std::string& root, const std::string& tmp, const std::string& name, int64_t iteration,
                 const std::vector<std::pair<std::string, std::string>>& files);

// root_or_dir is either a checkpoint directory (has manifest.json) or a root with the pointer
// (or, after a crash between a re-save's renames, the aside directory it names). Returns the
// checkpoint directory; throws CheckpointError saying what is missing.
std::string resolve_checkpoint_dir(const std::string& root_or_dir);

}   // namespace rh::ckpt::detail
