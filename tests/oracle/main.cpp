// The oracle tests' entry point: they run tiktoken's WebAssembly build and Hugging Face's
// tokenizers under node.
// Where node or the package is missing, every test reports "skipped" to ctest (exit 77), with
// the reason, never "passed".
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "catch/run.h"
#include "data/tokenizer.h"
#include "test_util.h"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::strncmp(argv[i], "--list", 6) == 0;
  if (!listing) {
    if (ptrain::test::run_shell("node --version").exit_code != 0) {
      std::printf("skipped: these tests run tiktoken under node, and node is not installed\n");
      return 77;
    }
    const std::filesystem::path cache = ptrain::data_cache_dir();
    for (const auto& [package, what] : {std::pair{cache / "tiktoken" / "tiktoken_bg.wasm", "tiktoken's WebAssembly build"},
                                        std::pair{cache / "hf-tokenizers" / "index.js", "Hugging Face's tokenizers"}})
      if (!std::filesystem::exists(package)) {
        std::printf("skipped: %s is not at %s (./scripts/fetch-data.sh fetches it)\n", what, package.c_str());
        return 77;
      }
    // The fetch keeps the binding's x86-64 glibc build only.
    const std::string binding = (cache / "hf-tokenizers" / "index.js").string();
    if (ptrain::test::run_shell("node -e \"require('" + binding + "')\"").exit_code != 0) {
      std::printf("skipped: Hugging Face's tokenizers (%s) does not load on this machine (its fetched build is "
                  "x86-64 glibc Linux's)\n",
                  binding.c_str());
      return 77;
    }
  }
  return ptrain::test::run_catch(argc, argv);
}
