// XAttention: per query head and query block, block 0, the diagonal and the highest-scoring blocks up to softmax mass
// tau, from antidiagonal scores (xattn_select). Without a selection (decode steps, a chunk that does not start on a
// block boundary) the head attends densely: the method is a prefill method.
#include <cmath>

#include <nlohmann/json.hpp>

#include "elastic/sparse_pattern.h"

namespace elastic {

extern const SparsePattern kXAttnPattern;
const SparsePattern kXAttnPattern{
    .name = "xattn",
    .aliases = {"xa"},
    .letter = 'X',
    .keeps = [](int qb, int kb, const SparseSettings&, const BlockMask* sel) {
      return !sel || sel->n_blocks == 0 || sel->at(qb, kb);
    },
    .select =
        [](const float* q, const float* k, int n_pos, int hd, const SparseSettings& s, int q_begin) {
          XAttnParams p = s.xattn;
          p.block = s.block;
          return xattn_select(q, k, n_pos, hd, p, q_begin);
        },
    .on_cuda = true,
    // {"xattn": {"stride": 16, "tau": 0.9}}
    .read_params =
        [](const nlohmann::json& j, SparseSettings& s, const std::string& src, bool required) {
          if (!j.contains("xattn")) {
            if (required) throw std::runtime_error(src + ": missing 'xattn'");
            return;
          }
          const nlohmann::json& x = j["xattn"];
          if (!x.is_object()) throw std::runtime_error(src + ": 'xattn' must be an object");
          s.xattn.stride = sparse_int_field(x, "stride", 16, src, "xattn.stride", required);
          if (!x.contains("tau")) {
            if (required) throw std::runtime_error(src + ": missing 'xattn.tau'");
            return;
          }
          if (!x["tau"].is_number()) throw std::runtime_error(src + ": 'xattn.tau' must be a number");
          const double tau = x["tau"].get<double>();
          // Checked as a double: narrowing one beyond float's range is undefined.
          if (!(tau > 0 && tau <= 1)) throw std::runtime_error(src + ": 'xattn.tau' must be in (0, 1]");
          s.xattn.tau = static_cast<float>(tau);
        },
    .write_params =
        [](const SparseSettings& s, nlohmann::json& j) {
          j["xattn"] = {{"stride", s.xattn.stride},
                        {"tau", std::round(static_cast<double>(s.xattn.tau) * 1e6) / 1e6}};
        },
};

}  // namespace elastic
