// Checks of the places ptrain will write, made while planning (before anything is written), so
// that what the machine would refuse later (a name too long, a read-only filesystem, a file where
// a directory must go, a symbolic-link loop) is bad input now: exit 2, naming the key or flag.
#pragma once

#include <string>

namespace ptrain {

// Where scripts/fetch-data.sh puts what it fetches, and ptrain caches what it measures once per
// machine: $PTRAIN_CACHE, else ~/.cache/ptrain.
std::string data_cache_dir();

enum class PathKind { missing, directory, file, other };  // file: a regular file; other: FIFO, device, ...

// What is at `path` (following links). Throws UserError naming `what` when the path cannot be
// examined: a symbolic-link loop, a name too long, a component that is not a directory.
PathKind path_kind(const std::string& path, const std::string& what);

// `dir` has no entries (false when it cannot be read; an empty regular file counts as empty,
// so callers look at what the path is first).
bool is_empty_directory(const std::string& dir);

// `path` is a writable directory or can be created as one, with `extra` more bytes of names
// below it (the files ptrain puts inside): each new component within the filesystem's name
// limit, the whole within PATH_MAX, the nearest existing ancestor a writable directory on a
// read-write filesystem.
void check_creatable(const std::string& path, const std::string& what, size_t extra = 0);

// `dir` is an existing directory whose entries ptrain may create, rename and remove (tried: an
// empty directory is made in it and removed at once).
void check_writable_dir(const std::string& dir, const std::string& what);

// A file ptrain reads from a directory it was given (a checkpoint's files, a Hugging Face model's
// config and weights). A symbolic link there is followed only to a file inside that directory,
// or to a blob of Hugging Face's cache (models--ORG--NAME/blobs/<hash>, which its snapshots and
// huggingface_hub's linked downloads point into). Any other link is refused (UserError naming
// `what` and the link), so a planted link cannot make ptrain read, or print, a file elsewhere.
void check_link_stays_inside(const std::string& dir, const std::string& name, const std::string& what);

}  // namespace ptrain
