#pragma once
// A variant chosen by an environment variable (ELASTIC_ATTN_KERNEL, ELASTIC_DECODE_LOADS, ...): the value named by
// the variable, `unset` when it is unset or empty; any other value throws std::invalid_argument naming the variable
// and the accepted values. Callers read it once, when a backend is built (attention_config_from_env), or in the dev
// area's variants (dev/cuda/).
// The same name table serves choice_name, so logs name a variant exactly as the variable spells it.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace elastic::cuda {

template <class E>
using Choice = std::pair<const char*, E>;

// The value `names` gives `value`; throws std::invalid_argument "<what> must be one of a, b, ... (got 'value')".
template <class E, size_t N>
E choice_by_name(const char* what, const char* value, const Choice<E> (&names)[N]) {
  std::string known;
  for (const auto& nv : names) {
    if (std::strcmp(value, nv.first) == 0) return nv.second;
    known += (known.empty() ? "" : ", ") + std::string(nv.first);
  }
  throw std::invalid_argument(std::string(what) + " must be one of " + known + " (got '" + value + "')");
}

template <class E, size_t N>
E env_choice(const char* var, const Choice<E> (&names)[N], E unset) {
  const char* e = std::getenv(var);
  if (!e || !*e) return unset;
  return choice_by_name(var, e, names);
}

// The name of `value` in `names` (nullptr when it has none).
template <class E, size_t N>
const char* choice_name(const Choice<E> (&names)[N], E value) {
  for (const auto& nv : names)
    if (nv.second == value) return nv.first;
  return nullptr;
}

}  // namespace elastic::cuda
