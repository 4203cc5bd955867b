// How ranks talk. Training code asks its Communicator for rank/world size and reduces
// metrics through it; with one process every collective is the identity. MPI and NCCL
// implementations arrive with data-parallel training.
#pragma once

#include <memory>

namespace ptrain {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Sum of `value` over all ranks, the same on every rank.
  virtual double all_reduce_sum(double value) = 0;
  bool is_main() const { return rank() == 0; }
};

std::unique_ptr<Communicator> make_single_process_communicator();

}  // namespace ptrain
