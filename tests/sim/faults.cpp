// Fault injection for the simulated device (sim.h): a chosen call of a library function fails
// with a chosen status, so that the backend's handling of what a real GPU can answer (out of
// memory, no cuBLASLt algorithm, a cuDNN graph no engine takes, a failed NCCL communicator)
// runs in the tests and not only on the day it happens.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "sim.h"

namespace ptrain::sim {
namespace {

struct Fault {
  int calls_left;  // calls to let through before the first failing one
  int failures_left;
  int status;
};

struct Faults {
  std::mutex mutex;
  std::map<std::string, Fault> armed;  // by function name

  // PTRAIN_SIM_FAIL=function:nth:status[:times][,...]
  Faults() {
    const char* spec = std::getenv("PTRAIN_SIM_FAIL");
    if (!spec) return;
    const std::vector<std::string> items = split(spec, ',');
    for (const std::string& item : items) {
      const std::vector<std::string> f = split(item, ':');
      const int nth = f.size() >= 3 ? std::atoi(f[1].c_str()) : 0, status = f.size() >= 3 ? std::atoi(f[2].c_str()) : 0;
      const int times = f.size() == 4 ? std::atoi(f[3].c_str()) : 1;
      if (f.size() < 3 || f.size() > 4 || nth < 1 || status == 0 || times < 1) {
        std::fprintf(stderr, "simulated device: PTRAIN_SIM_FAIL item '%s' is not function:nth:status[:times]\n",
                     item.c_str());
        std::abort();
      }
      armed[f[0]] = Fault{nth - 1, times, status};
    }
  }

  static std::vector<std::string> split(const std::string& text, char separator) {
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t end; (end = text.find(separator, start)) != std::string::npos; start = end + 1)
      parts.push_back(text.substr(start, end - start));
    parts.push_back(text.substr(start));
    return parts;
  }
};

Faults& faults() {
  static Faults* f = new Faults;  // never destroyed, as the device's state
  return *f;
}

}  // namespace

void fail_call(const std::string& function, int nth, int status, int times) {
  Faults& f = faults();
  std::lock_guard<std::mutex> lock(f.mutex);
  f.armed[function] = Fault{nth - 1, times, status};
}

void clear_faults() {
  Faults& f = faults();
  std::lock_guard<std::mutex> lock(f.mutex);
  f.armed.clear();
}

int injected_failure(const char* function) {
  Faults& f = faults();
  std::lock_guard<std::mutex> lock(f.mutex);
  const auto it = f.armed.find(function);
  if (it == f.armed.end()) return 0;
  if (it->second.calls_left > 0) {
    --it->second.calls_left;
    return 0;
  }
  const int status = it->second.status;
  if (--it->second.failures_left == 0) f.armed.erase(it);
  return status;
}

}  // namespace ptrain::sim
