// A checkpoint root on disk: DIR/<tag>/ directories, each committed by one rename, and DIR/latest
// naming the newest tag (docs/DESIGN.md §8.4). A save writes into DIR/.<tag>.partial-<nonce>/;
// once every rank's files are written and synced, one rank writes the manifest into it, syncs it,
// renames the directory to DIR/<tag> (exchanging it with an older <tag>, which is then removed),
// syncs DIR, and replaces DIR/latest atomically. A kill at any point leaves every committed tag
// and `latest` as they were; at worst a .partial directory is left for the next save to remove.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace tessera::checkpoint {

inline constexpr int64_t kChunkBytes = int64_t{4} << 20;  // hashed and verified per chunk

uint64_t xxh3(const void* data, size_t bytes);
std::vector<uint64_t> chunk_hashes(const void* data, int64_t bytes, int64_t chunk_bytes = kChunkBytes);
// XXH3-64 of a whole file, read in chunks (CheckpointError naming the file).
uint64_t hash_file(const std::string& path);

// XXH3-64 of bytes given in order: a file's hash from the bytes its writer wrote, without reading
// it back (rank_file_writer.h also hashes each chunk alone while it is in cache).
class StreamHash {
 public:
  StreamHash();
  ~StreamHash();
  StreamHash(const StreamHash&) = delete;
  StreamHash& operator=(const StreamHash&) = delete;
  void update(const void* data, size_t bytes);
  uint64_t digest() const;

 private:
  void* state_;  // XXH3_state_t (xxhash.h stays out of this header)
};

// A tag must be a plain directory name: no '/', not "." / "..", not starting with '.', printable.
void check_tag(const std::string& tag);
std::string partial_dir(const std::string& root, const std::string& tag, const std::string& nonce);
// Removes leftovers of interrupted saves (DIR/.<anything>.partial-*); never a committed tag, and
// not the paths in `skip` (replaced tags a BackgroundRemoval is removing already).
void remove_partials(const std::string& root, const std::set<std::string>& skip = {});
// Renames `partial` to root/tag as described above. An older root/tag is exchanged with it in one
// step and left, out of sight, at `partial`'s path: returned for the caller to remove ("" if none).
std::string commit_tag(const std::string& root, const std::string& partial, const std::string& tag);
void write_latest(const std::string& root, const std::string& tag);
// The tag DIR/latest names (CheckpointError naming DIR when there is none).
std::string read_latest(const std::string& root);
// The committed tags under root, oldest first (by their manifests' modification time).
std::vector<std::string> committed_tags(const std::string& root);
void remove_tag(const std::string& root, const std::string& tag);
void fsync_path(const std::string& path);  // a file or a directory
std::string read_text(const std::string& path);  // CheckpointError naming it

}  // namespace tessera::checkpoint
