// The angles of rotary position embeddings (RoPE), made once per run on the host and uploaded:
// the table Backend::rope_forward reads.
#pragma once

#include <vector>

namespace ptrain {

// cos and sin of angle(t, i) = t * theta^(-2i/hs) for positions t < T and pairs i < hs/2, as
// (T, hs/2, 2) row-major floats. Computed the way Hugging Face's LlamaRotaryEmbedding does, all
// in FP32 (inverse frequency 1 / theta^(2i/hs), times the position, then cos and sin), since a
// double angle drifts from it by about 1e-4 rad at position 2048 and weights trained under one
// would see slightly other positions under the other. hs must be even.
std::vector<float> rope_table(int T, int head_size, double theta);

}  // namespace ptrain
