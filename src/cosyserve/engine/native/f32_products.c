/* Float32 one-row products for exact LM decoding on AVX2 (cosyserve.engine.native_f32 calls this;
 * cosyserve.engine.native_int8 builds it into the same library as the int8 kernels).
 *
 * y (rows, n) = x (rows, k) . w (n, k)^T + bias, all float32, w as a checkpoint stores it.
 *
 * A decoding step reads every weight once, so its speed is the speed at which the weights stream from
 * memory. On an AVX2-only AMD EPYC whose sum reads 27-35 GB/s, MKL's one-row products read this
 * layout at 15-20 GB/s and oneDNN's blocked copy at 20-28 GB/s; this reads it at 22-30 GB/s, with no
 * copy: each thread takes a contiguous stretch of groups of GROUP output rows and streams the group's
 * rows side by side, one 256-bit load of each per 8 inputs.
 *
 * An RMSNorm in front of the product can be computed inside it (the LM's two per layer: torch's
 * rms_norm took ~25 us a call there, 49 calls a step), with torch's arithmetic: the row scaled by its
 * 1 / rms, then by the norm's weight, before the product.
 *
 * Every output is summed in the same order whatever the number of rows in a call: lane j of an
 * accumulator takes inputs j, j + 8, j + 16, ... in order with fused multiply-adds, a tail of fewer
 * than 8 inputs adds into lanes 0.., then the 8 lanes are added pairwise (0+4, 1+5, ..., then 0+2,
 * 1+3, then 0+1), then the bias. So a request's values do not depend on how many other rows share its
 * call (decoding batches), only on its own row.
 *
 * Built with plain flags: the function carries its own target attribute, so the library loads on any
 * x86-64 CPU, and the caller only calls it where /proc/cpuinfo lists avx2 and fma.
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define AVX2 __attribute__((target("avx2,fma")))
#define GROUP 8     /* weight rows streamed side by side: 8 accumulators hide the FMA latency */
#define MAX_ROWS 16 /* input rows per call (decoding batches); longer inputs go to a matrix product */

AVX2 static inline float lane_sum(__m256 v) {
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
}

/* y[j] = w[j] . x for `count` (1..GROUP) weight rows from `w`; `tail_mask` selects the k % 8 last inputs. */
AVX2 static inline __attribute__((always_inline)) void rows_dot(const float *x, int k, const float *w, int count,
                                                                 __m256i tail_mask, const float *bias, float *y) {
    __m256 acc[GROUP];
    for (int j = 0; j < count; j++) acc[j] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        for (int j = 0; j < count; j++)
            acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(w + (size_t)j * k + i), xv, acc[j]);
    }
    if (i < k) {
        __m256 xv = _mm256_maskload_ps(x + i, tail_mask);
        for (int j = 0; j < count; j++)
            acc[j] = _mm256_fmadd_ps(_mm256_maskload_ps(w + (size_t)j * k + i, tail_mask), xv, acc[j]);
    }
    for (int j = 0; j < count; j++) y[j] = lane_sum(acc[j]) + (bias ? bias[j] : 0.f);
}

AVX2 static void group_product(const float *x, int k, const float *w, int count, __m256i tail_mask,
                               const float *bias, float *y) {
    if (count == GROUP) /* a constant count: the loops over rows unroll and stay in registers */
        rows_dot(x, k, w, GROUP, tail_mask, bias, y);
    else
        for (int j = 0; j < count; j++) rows_dot(x, k, w + (size_t)j * k, 1, tail_mask, bias ? bias + j : 0, y + j);
}

/* Row `x` RMS-normalised as torch's rms_norm does it in float32: out = (x * (1 / sqrt(mean(x^2) + eps))) * g. */
AVX2 static void rms_norm_row(const float *x, int k, const float *g, float eps, float *out) {
    __m256 squares = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= k; i += 8) squares = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(x + i), squares);
    float sum = lane_sum(squares);
    for (; i < k; i++) sum += x[i] * x[i];
    float inverse = 1.f / sqrtf(sum / (float)k + eps);
    for (i = 0; i < k; i++) out[i] = (x[i] * inverse) * g[i];
}

/* x (rows, k), w (n, k) row-major, bias (n,) or NULL, y (rows, n). With norm_weight (k,) each row is
 * RMS-normalised first (norm_eps; into scratch, rows * k floats). Returns 0, or -1 for arguments it
 * cannot take. */
AVX2 int cosyserve_f32_linear_avx2(const float *x, int rows, int k, const float *w, const float *bias, float *y,
                                   int n, int threads, const float *norm_weight, float norm_eps, float *scratch) {
    if (rows < 1 || rows > MAX_ROWS || k < 1 || n < 1 || threads < 1 || (norm_weight && !scratch)) return -1;
    if (norm_weight) {
        for (int r = 0; r < rows; r++) rms_norm_row(x + (size_t)r * k, k, norm_weight, norm_eps, scratch + (size_t)r * k);
        x = scratch;
    }
    int32_t lanes[8];
    for (int j = 0; j < 8; j++) lanes[j] = j < k % 8 ? -1 : 0;
    __m256i tail_mask = _mm256_loadu_si256((const __m256i *)lanes);
    int groups = (n + GROUP - 1) / GROUP;
    /* Static schedule: each thread walks one contiguous stretch of groups, i.e. of memory. The rows of
     * x run inside a group, whose weights are then read from cache. */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int g = 0; g < groups; g++) {
        int first = g * GROUP, count = n - first < GROUP ? n - first : GROUP;
        for (int r = 0; r < rows; r++)
            group_product(x + (size_t)r * k, k, w + (size_t)first * k, count, tail_mask, bias ? bias + first : 0,
                          y + (size_t)r * n + first);
    }
    return 0;
}
