// cuBLASLt projections: Y[M, N] = X[M, K] W[N, K]^T (+ bias[N]) (+ beta * Y), bf16 in, fp32 accumulate.
//
// Layout. cuBLASLt is column-major; a row-major [R, C] buffer is the same bytes as a column-major C x R matrix with
// leading dimension C (its transpose). So, in column-major terms:
//   X (row-major [M, K]) is the col-major K x M matrix X^T, ld K;
//   W (row-major [N, K]) is the col-major K x N matrix W^T, ld K;
//   Y (row-major [M, N]) is the col-major N x M matrix Y^T, ld N.
// Y = X W^T  <=>  Y^T = W X^T = op_T(W^T buffer) * op_N(X^T buffer). Hence the cuBLASLt problem is
//   m = N, n = M, k = K, A = W (layout K x N, ld K, TRANSA = T), B = X (layout K x M, ld K, TRANSB = N),
//   C = D = Y (layout N x M, ld N).
// This is the "TN" form, the native one for Hopper bf16 kernels. D's rows are the N output features, so the bias
// epilogue (a vector of D-row length broadcast over columns) adds bias[n] to every token, as wanted.
//
// Plans (descriptors + the heuristic's algorithm) are cached per (M, N, K, output type, bias, beta != 0) and the
// pointer alignments the heuristic was told about, so a cached algorithm is never run on less aligned buffers.
// Not thread-safe: the cache, the matmul descriptor's bias pointer and the single workspace are shared, so one
// Gemm object must be used by one host thread and its calls must not run concurrently on different streams.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "elastic/cuda.h"
#include "elastic/cuda_gemm.h"
#include "gemv_small_m.cuh"

namespace elastic::cuda {
namespace {

void lt_check(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(std::string("cuBLASLt: ") + call + " failed: " + cublasLtGetStatusName(s) + " (" +
                           cublasLtGetStatusString(s) + ")");
}
#define ELASTIC_LT_CHECK(call) lt_check((call), #call)

// Largest power of two dividing the address, capped at 256 (the heuristic's default assumption).
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  const uintptr_t low = a & (~a + 1);
  return low >= 256 ? 256u : static_cast<uint32_t>(low);
}

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, cd = nullptr;  // cd: C and D share one layout (in place)
  cublasLtMatmulAlgo_t algo{};
};

// Strided batches (Gemm::bf16_out_f32_batched): count 1 is the plain product; strides in elements.
struct Batch {
  int count = 1;
  int64_t sx = 0, sw = 0, sy = 0;
};

// M, N, K, out type, has bias, beta != 0, alignments of W, X, Y, bias, W not transposed (the backward's "NN"), then
// the batch count and its three strides.
using Key = std::tuple<int, int, int, int, int, int, uint32_t, uint32_t, uint32_t, uint32_t, int, int, int64_t, int64_t,
                       int64_t>;

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<Key, Plan> plans;
  int pinned = 0;   // pin_rows
  int small_m = 0;  // set_small_m_rows
  bool use_small_m(const void* X, const void* W, int M, int K) const {
    return pinned == 0 && M <= small_m && small_m_gemv_fits(X, W, M, K);
  }

  static void destroy(Plan& p) {  // no-throw cleanup
    if (p.cd) cublasLtMatrixLayoutDestroy(p.cd);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    p = Plan{};
  }

  ~Impl() {
    for (auto& kv : plans) destroy(kv.second);
    if (workspace) cudaFree(workspace);
    if (handle) cublasLtDestroy(handle);
  }

  // nn = false: Y[M, N] = X[M, K] W[N, K]^T.  nn = true: Y[M, N] = X[M, K] W[K, N] (W row-major [K, N]).
  void run(const void* X, const void* W, void* Y, int M, int N, int K, cudaDataType_t out_type, const void* bias,
           float beta, size_t ws_bytes, cudaStream_t stream, bool nn = false, Batch batch = {}) {
    const Key key{M,
                  N,
                  K,
                  static_cast<int>(out_type),
                  bias != nullptr,
                  beta != 0.f,
                  alignment_of(W),
                  alignment_of(X),
                  alignment_of(Y),
                  alignment_of(bias),
                  nn ? 1 : 0,
                  batch.count,
                  batch.sx,
                  batch.sw,
                  batch.sy};
    auto it = plans.find(key);
    if (it == plans.end()) {
      Plan p = make_plan(M, N, K, out_type, bias, X, W, Y, ws_bytes, nn, batch);
      if (pinned > 0 && M < pinned) {
        // The algorithm of the same call with `pinned` rows (planned, and cached, under its own key).
        Key at = key;
        std::get<0>(at) = pinned;
        auto pit = plans.find(at);
        if (pit == plans.end()) {
          try {
            pit = plans.emplace(at, make_plan(pinned, N, K, out_type, bias, X, W, Y, ws_bytes, nn, batch)).first;
          } catch (...) {
            destroy(p);
            throw;
          }
        }
        cublasLtMatmulHeuristicResult_t chk{};
        const cublasStatus_t s =
            cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.cd, p.cd, &pit->second.algo, &chk);
        if (s != CUBLAS_STATUS_SUCCESS || chk.state != CUBLAS_STATUS_SUCCESS || chk.workspaceSize > ws_bytes) {
          destroy(p);
          throw std::runtime_error("cuBLASLt: the algorithm pinned for " + std::to_string(pinned) +
                                   " rows does not run M " + std::to_string(M) + " N " + std::to_string(N) + " K " +
                                   std::to_string(K) + " (" + cublasLtGetStatusName(s != CUBLAS_STATUS_SUCCESS ? s : chk.state) + ")");
        }
        p.algo = pit->second.algo;
      }
      it = plans.emplace(key, p).first;
    }
    Plan& p = it->second;
    if (bias)  // the bias pointer lives in the descriptor; refresh it for this call (same alignment as planned)
      ELASTIC_LT_CHECK(
          cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    const float alpha = 1.f;
    ELASTIC_LT_CHECK(cublasLtMatmul(handle, p.desc, &alpha, W, p.a, X, p.b, &beta, Y, p.cd, Y, p.cd, &p.algo,
                                    workspace, ws_bytes, stream));
  }

  Plan make_plan(int M, int N, int K, cudaDataType_t out_type, const void* bias, const void* X, const void* W,
                 const void* Y, size_t ws_bytes, bool nn, Batch batch) {
    Plan p;
    try {
      ELASTIC_LT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      // NN: the row-major [K, N] W buffer is the col-major N x K matrix W^T itself, so A needs no transpose.
      const int32_t ta = nn ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
      ELASTIC_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      ELASTIC_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      if (bias) {
        // Bias elements have D's type (bf16 here; only IMMA / fp8 kernels differ); set it explicitly anyway.
        const uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        const int32_t bias_type = out_type;
        ELASTIC_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
        ELASTIC_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                        sizeof(bias_type)));
        // The heuristic reads the bias pointer's value to know its alignment.
        ELASTIC_LT_CHECK(
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      }
      if (nn)
        ELASTIC_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, N, K, N));  // W buffer, op N
      else
        ELASTIC_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, K, N, K));  // W^T buffer, op T
      ELASTIC_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, M, K));  // X^T buffer, op N
      ELASTIC_LT_CHECK(cublasLtMatrixLayoutCreate(&p.cd, out_type, N, M, N));    // Y^T buffer
      if (batch.count > 1) {  // the same layouts, batch.count times at the given strides
        const struct {
          cublasLtMatrixLayout_t l;
          int64_t stride;
        } ls[] = {{p.a, batch.sw}, {p.b, batch.sx}, {p.cd, batch.sy}};
        for (const auto& x : ls) {
          ELASTIC_LT_CHECK(cublasLtMatrixLayoutSetAttribute(x.l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch.count,
                                                            sizeof(batch.count)));
          ELASTIC_LT_CHECK(cublasLtMatrixLayoutSetAttribute(x.l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                            &x.stride, sizeof(x.stride)));
        }
      }

      cublasLtMatmulPreference_t pref = nullptr;
      ELASTIC_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      cublasLtMatmulHeuristicResult_t res{};
      int count = 0;
      cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
      {
        const uint64_t ws = ws_bytes;
        const uint32_t al_a = alignment_of(W), al_b = alignment_of(X), al_cd = alignment_of(Y);
        const struct {
          cublasLtMatmulPreferenceAttributes_t attr;
          const void* v;
          size_t n;
        } prefs[] = {{CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)},
                     {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)},
                     {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)},
                     {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_cd, sizeof(al_cd)},
                     {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_cd, sizeof(al_cd)}};
        for (const auto& x : prefs) {
          s = cublasLtMatmulPreferenceSetAttribute(pref, x.attr, x.v, x.n);
          if (s != CUBLAS_STATUS_SUCCESS) break;
        }
        if (s == CUBLAS_STATUS_SUCCESS)
          s = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.cd, p.cd, pref, 1, &res, &count);
      }
      cublasLtMatmulPreferenceDestroy(pref);
      lt_check(s, "cublasLtMatmulPreferenceSetAttribute / cublasLtMatmulAlgoGetHeuristic");
      if (count < 1 || res.state != CUBLAS_STATUS_SUCCESS)
        throw std::runtime_error("cuBLASLt: cublasLtMatmulAlgoGetHeuristic found no algorithm for M " +
                                 std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K) +
                                 (out_type == CUDA_R_32F ? " fp32 out" : " bf16 out") + (bias ? " + bias" : "") +
                                 " (state " + cublasLtGetStatusName(res.state) + ")");
      p.algo = res.algo;
    } catch (...) {
      destroy(p);
      throw;
    }
    return p;
  }
};

namespace {
void check_shape(const char* fn, const void* X, const void* W, const void* Y, int M, int N, int K) {
  if (M <= 0 || N <= 0 || K <= 0)
    throw std::invalid_argument(std::string("Gemm::") + fn + ": shapes must be positive (M " + std::to_string(M) +
                                ", N " + std::to_string(N) + ", K " + std::to_string(K) + ")");
  if (!X || !W || !Y) throw std::invalid_argument(std::string("Gemm::") + fn + ": null X, W or Y");
}
}  // namespace

Gemm::Gemm(size_t workspace_bytes) : impl_(new Impl), ws_bytes_(workspace_bytes) {
  ELASTIC_LT_CHECK(cublasLtCreate(&impl_->handle));
  if (ws_bytes_ > 0) ELASTIC_CUDA_CHECK(cudaMalloc(&impl_->workspace, ws_bytes_));  // 256-byte aligned
}

Gemm::~Gemm() = default;

void Gemm::pin_rows(int max_rows) {
  if (max_rows < 0) throw std::invalid_argument("Gemm::pin_rows: max_rows must be >= 0");
  if (!impl_->plans.empty() && max_rows != impl_->pinned)
    throw std::logic_error("Gemm::pin_rows: set before the first call (plans are cached)");
  impl_->pinned = max_rows;
}
int Gemm::pinned_rows() const { return impl_->pinned; }

void Gemm::set_small_m_rows(int rows) {
  if (rows < 0 || rows > kSmallMMaxRows)
    throw std::invalid_argument("Gemm::set_small_m_rows: rows must be 0.." + std::to_string(kSmallMMaxRows) +
                                ", got " + std::to_string(rows));
  impl_->small_m = rows;
}
int Gemm::small_m_rows() const { return impl_->small_m; }

void Gemm::bf16(const uint16_t* X, const uint16_t* W, uint16_t* Y, int M, int N, int K, cudaStream_t stream,
                const uint16_t* bias, float beta) {
  check_shape("bf16", X, W, Y, M, N, K);
  if (impl_->use_small_m(X, W, M, K)) return small_m_gemv(X, W, Y, false, M, N, K, bias, beta, stream);
  impl_->run(X, W, Y, M, N, K, CUDA_R_16BF, bias, beta, ws_bytes_, stream);
}

void Gemm::bf16_out_f32(const uint16_t* X, const uint16_t* W, float* Y, int M, int N, int K, cudaStream_t stream) {
  check_shape("bf16_out_f32", X, W, Y, M, N, K);
  if (impl_->use_small_m(X, W, M, K)) return small_m_gemv(X, W, Y, true, M, N, K, nullptr, 0.f, stream);
  impl_->run(X, W, Y, M, N, K, CUDA_R_32F, nullptr, 0.f, ws_bytes_, stream);
}

void Gemm::bf16_out_f32_batched(const uint16_t* X, const uint16_t* W, float* Y, int M, int N, int K, int batch,
                                int64_t stride_x, int64_t stride_w, int64_t stride_y, cudaStream_t stream) {
  check_shape("bf16_out_f32_batched", X, W, Y, M, N, K);
  if (batch <= 0 || stride_x < 0 || stride_w < 0 || stride_y < int64_t(M) * N)
    throw std::invalid_argument("Gemm::bf16_out_f32_batched: batch must be > 0, strides >= 0 and Y's stride >= M * N "
                                "(batch " + std::to_string(batch) + ", Y stride " + std::to_string(stride_y) + ")");
  impl_->run(X, W, Y, M, N, K, CUDA_R_32F, nullptr, 0.f, ws_bytes_, stream, false,
             Batch{batch, stride_x, stride_w, stride_y});
}

void Gemm::bf16_dx_f32(const uint16_t* dY, const uint16_t* W, float* dX, int M, int N, int K, cudaStream_t stream,
                       float beta) {
  check_shape("bf16_dx_f32", dY, W, dX, M, N, K);
  // dX[M, K] = dY[M, N] W[N, K]: the NN form with the inner dimension N.
  impl_->run(dY, W, dX, M, K, N, CUDA_R_32F, nullptr, beta, ws_bytes_, stream, true);
}

}  // namespace elastic::cuda
