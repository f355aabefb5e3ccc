/* Int8 products for LM decoding on AVX-512 VNNI (cosyserve.engine.native_int8 builds and loads this).
 *
 * y (rows, n) = dequant(x (rows, k) as uint8 per row) . dequant(w (n, k) as int8 per output channel)^T
 *               + bias
 *
 * A decoding step reads every weight once, so its speed is the speed at which the weights stream
 * from memory. The weights are laid out in the order one `vpdpbusd` consumes them: for each block of
 * 16 outputs, for each group of 4 inputs, 16 x 4 int8 values (64 bytes, one register). A thread walks
 * its blocks front to back, so it reads one contiguous stretch of memory.
 *
 * Arithmetic (as fbgemm's dynamic int8 product on a VNNI CPU, but with one scale per row instead of
 * per tensor): x_q = clamp(round(x / s) + z, 0, 255) with s = (max(x, 0) - min(x, 0)) / 255 and z the
 * rounded zero point; acc = sum_k x_q w_q exactly in int32; y = s * w_scale * (acc - z * sum_k w_q) + bias.
 * A row with a non-finite value comes out as NaN.
 *
 * With norm_eps >= 0 each row is RMS-normalised first, x / sqrt(mean(x^2) + norm_eps), the norm's
 * weight being folded into w by the caller: the row is quantised as it is and its scale s multiplied by
 * the row's 1 / rms (quantisation is scale-free), so the norm costs one sum of squares.
 *
 * Built with plain flags: the AVX-512 code carries its own target attribute, so the library loads on
 * any x86-64 CPU, and the caller only calls it where /proc/cpuinfo lists avx512_vnni.
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define BLOCK 16         /* outputs per block: one register of int32 accumulators */
#define ROW_TILE 4       /* rows sharing one load of a weight register */
#define MAX_ROWS 64      /* rows per call: the caller splits larger inputs */
/* Weights are prefetched this far ahead into L2, not L1 (_MM_HINT_T1): in a decoding step the small
 * operations between products then find more of their own data in L1 (Intel Xeon with AMX, step of
 * 24 layers: 21.2-21.3 ms against 22.4-24.0 with _MM_HINT_T0; _MM_HINT_NTA halves the products' speed). */
#define PREFETCH 4096

int cosyserve_int8_abi(void) { return 2; }

/* Quantize one row; returns 0 when a value is not finite (then the row's output is NaN). */
VNNI static int quantize_row(const float *x, int k, int k_padded, float norm_eps, uint8_t *q, float *scale,
                             int32_t *zero) {
    /* One pass for the range, the sum of squares and finiteness, 16 values a step (a tail of zeros
     * changes none of them: the range includes 0). */
    __m512 low = _mm512_setzero_ps(), high = _mm512_setzero_ps(), sum = _mm512_setzero_ps();
    __mmask16 finite_lanes = 0xFFFF;
    for (int i = 0; i < k; i += 16) {
        __mmask16 part = k - i >= 16 ? 0xFFFF : (__mmask16)((1u << (k - i)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(part, x + i);
        finite_lanes &= _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_EQ_OQ);
        low = _mm512_min_ps(low, v);
        high = _mm512_max_ps(high, v);
        sum = _mm512_fmadd_ps(v, v, sum);
    }
    float lo = _mm512_reduce_min_ps(low), hi = _mm512_reduce_max_ps(high), squares = _mm512_reduce_add_ps(sum);
    if (finite_lanes != 0xFFFF) { /* the row comes out NaN: nothing to quantise */
        memset(q, 0, (size_t)k_padded);
        *scale = 1.f;
        *zero = 0;
        return 0;
    }
    float s = (hi - lo) / 255.f;
    if (!(s > 0.f) || !isfinite(s)) s = 1.f;
    float inverse = 1.f / s;
    int z = (int)nearbyintf(-lo * inverse);
    z = z < 0 ? 0 : (z > 255 ? 255 : z);
    for (int i = 0; i < k; i++) {
        float v = nearbyintf(x[i] * inverse) + (float)z;
        v = v < 0.f ? 0.f : (v > 255.f ? 255.f : v);
        q[i] = (uint8_t)v;
    }
    for (int i = k; i < k_padded; i++) q[i] = (uint8_t)z; /* the padded weights are 0 */
    *scale = norm_eps >= 0.f ? s / sqrtf(squares / (float)k + norm_eps) : s;
    *zero = z;
    return 1;
}

/* One block of 16 outputs for up to ROW_TILE rows. */
VNNI static void block_product(const uint8_t *xq, int k_padded, int rows, const int8_t *w, const float *x_scale,
                               const int32_t *x_zero, const int *x_finite, const float *w_scale,
                               const int32_t *w_sum, const float *bias, float *y, int n, int first) {
    __m512i even[ROW_TILE], odd[ROW_TILE];
    for (int r = 0; r < ROW_TILE; r++) even[r] = odd[r] = _mm512_setzero_si512();
    const int32_t *groups = (const int32_t *)xq; /* 4 uint8 inputs per int32 */
    int k4 = k_padded / 4, g = 0;
    for (; g + 1 < k4; g += 2) { /* two accumulators per row: consecutive vpdpbusd do not wait */
        const int8_t *at = w + (size_t)g * 64;
        _mm_prefetch((const char *)(at + PREFETCH), _MM_HINT_T1);
        _mm_prefetch((const char *)(at + PREFETCH + 64), _MM_HINT_T1);
        __m512i w0 = _mm512_loadu_si512((const void *)at), w1 = _mm512_loadu_si512((const void *)(at + 64));
        for (int r = 0; r < rows; r++) {
            even[r] = _mm512_dpbusd_epi32(even[r], _mm512_set1_epi32(groups[r * k4 + g]), w0);
            odd[r] = _mm512_dpbusd_epi32(odd[r], _mm512_set1_epi32(groups[r * k4 + g + 1]), w1);
        }
    }
    if (g < k4) {
        __m512i w0 = _mm512_loadu_si512((const void *)(w + (size_t)g * 64));
        for (int r = 0; r < rows; r++)
            even[r] = _mm512_dpbusd_epi32(even[r], _mm512_set1_epi32(groups[r * k4 + g]), w0);
    }
    int valid = n - first < BLOCK ? n - first : BLOCK;
    __mmask16 mask = (__mmask16)((1u << valid) - 1u);
    __m512 scale = _mm512_maskz_loadu_ps(mask, w_scale + first);
    __m512i sum = _mm512_maskz_loadu_epi32(mask, w_sum + first);
    __m512 offset = bias ? _mm512_maskz_loadu_ps(mask, bias + first) : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++) {
        __m512 out;
        if (x_finite[r]) {
            __m512i acc = _mm512_add_epi32(even[r], odd[r]);
            acc = _mm512_sub_epi32(acc, _mm512_mullo_epi32(_mm512_set1_epi32(x_zero[r]), sum));
            __m512 row_scale = _mm512_mul_ps(scale, _mm512_set1_ps(x_scale[r]));
            out = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), row_scale, offset);
        } else {
            out = _mm512_set1_ps(NAN);
        }
        _mm512_mask_storeu_ps(y + (size_t)r * n + first, mask, out);
    }
}

/* x (rows, k) float32, w packed as above for (n, k_padded), w_scale and w_sum (n,), bias (n,) or NULL,
 * y (rows, n) float32, scratch rows * k_padded bytes, norm_eps < 0 for no norm. Returns 0, or -1 for
 * arguments it cannot take. */
VNNI int cosyserve_int8_linear(const float *x, int rows, int k, int k_padded, const int8_t *w, const float *w_scale,
                               const int32_t *w_sum, const float *bias, float *y, int n, int threads,
                               uint8_t *scratch, float norm_eps) {
    if (rows < 1 || rows > MAX_ROWS || k < 1 || k_padded < k || k_padded % 4 || n < 1 || threads < 1) return -1;
    float x_scale[MAX_ROWS];
    int32_t x_zero[MAX_ROWS];
    int x_finite[MAX_ROWS];
    for (int r = 0; r < rows; r++)
        x_finite[r] = quantize_row(x + (size_t)r * k, k, k_padded, norm_eps, scratch + (size_t)r * k_padded,
                                   &x_scale[r], &x_zero[r]);
    int blocks = (n + BLOCK - 1) / BLOCK;
    /* Static schedule: each thread walks one contiguous stretch of blocks, i.e. of memory. */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < blocks; b++) {
        const int8_t *block = w + (size_t)b * k_padded * BLOCK;
        for (int r = 0; r < rows; r += ROW_TILE) {
            int tile = rows - r < ROW_TILE ? rows - r : ROW_TILE;
            block_product(scratch + (size_t)r * k_padded, k_padded, tile, block, x_scale + r, x_zero + r,
                          x_finite + r, w_scale, w_sum, bias, y + (size_t)r * n, n, b * BLOCK);
        }
    }
    return 0;
}
