/* Int8 products for LM decoding on AVX-512 VNNI, and on AVX2 (cosyserve.engine.native_int8 builds and
 * loads this).
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
 * On AVX2 (`cosyserve_int8_linear_avx2`) the same layout is read as two 256-bit halves (outputs 0-7
 * and 8-15) and multiplied with `vpmaddubsw` + `vpmaddwd`: the first sums two uint8 x int8 products
 * into int16 with saturation, so activations take 7 bits there (0..127, as fbgemm's on such CPUs;
 * 2 x 127 x 127 < 32767) and the int32 sums stay exact. A single row (decoding) reads STREAMS
 * neighbouring blocks side by side there, which an AMD EPYC streams faster than one.
 *
 * Built with plain flags: each function carries its own target attribute, so the library loads on
 * any x86-64 CPU, and the caller only calls a function where /proc/cpuinfo lists its instructions.
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define AVX2 __attribute__((target("avx2,fma")))
#define BLOCK 16         /* outputs per block: one register of int32 accumulators */
#define ROW_TILE 4       /* rows sharing one load of a weight register */
#define MAX_ROWS 64      /* rows per call: the caller splits larger inputs */
#define STREAMS 4        /* AVX2, one row: neighbouring blocks read side by side (8 accumulators) */
/* Weights are prefetched this far ahead into L2, not L1 (_MM_HINT_T1): in a decoding step the small
 * operations between products then find more of their own data in L1 (Intel Xeon with AMX, step of
 * 24 layers: 21.2-21.3 ms against 22.4-24.0 with _MM_HINT_T0; _MM_HINT_NTA halves the products' speed). */
#define PREFETCH 4096

int cosyserve_int8_abi(void) { return 6; } /* with the other C files: the library's calling convention */

/* A row's range (including 0), sum of squares, and whether every value is finite. */
typedef int (*row_stats_fn)(const float *x, int k, float *lo, float *hi, float *squares);

VNNI static int row_stats_512(const float *x, int k, float *lo, float *hi, float *squares) {
    /* 16 values a step (a tail of zeros changes none of them: the range includes 0) */
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
    *lo = _mm512_reduce_min_ps(low), *hi = _mm512_reduce_max_ps(high), *squares = _mm512_reduce_add_ps(sum);
    return finite_lanes == 0xFFFF;
}

AVX2 static int row_stats_256(const float *x, int k, float *lo, float *hi, float *squares) {
    __m256 low = _mm256_setzero_ps(), high = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
    __m256 finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    int i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        finite = _mm256_and_ps(finite, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_EQ_OQ));
        low = _mm256_min_ps(low, v);
        high = _mm256_max_ps(high, v);
        sum = _mm256_fmadd_ps(v, v, sum);
    }
    float l[8], h[8], q[8];
    _mm256_storeu_ps(l, low), _mm256_storeu_ps(h, high), _mm256_storeu_ps(q, sum);
    int all_finite = _mm256_movemask_ps(finite) == 0xFF;
    for (; i < k; i++) { /* the tail, into lane 0 */
        all_finite &= isfinite(x[i]) != 0;
        l[0] = x[i] < l[0] ? x[i] : l[0], h[0] = x[i] > h[0] ? x[i] : h[0], q[0] += x[i] * x[i];
    }
    for (int j = 1; j < 8; j++) l[0] = l[j] < l[0] ? l[j] : l[0], h[0] = h[j] > h[0] ? h[j] : h[0], q[0] += q[j];
    *lo = l[0], *hi = h[0], *squares = q[0];
    return all_finite;
}

/* Quantize one row to 0..levels; returns 0 when a value is not finite (then the row's output is NaN).
 * Inlined into each instruction set's wrapper below, so that its rounding compiles to one instruction
 * (compiled for plain x86-64 it would call libm's nearbyintf for every value). */
static inline __attribute__((always_inline)) int quantize_row(const float *x, int k, int k_padded, float norm_eps,
                                                              int levels, row_stats_fn stats, uint8_t *q,
                                                              float *scale, int32_t *zero) {
    float lo, hi, squares;
    if (!stats(x, k, &lo, &hi, &squares)) { /* the row comes out NaN: nothing to quantise */
        memset(q, 0, (size_t)k_padded);
        *scale = 1.f;
        *zero = 0;
        return 0;
    }
    float top = (float)levels, s = (hi - lo) / top;
    if (!(s > 0.f) || !isfinite(s)) s = 1.f;
    float inverse = 1.f / s;
    int z = (int)nearbyintf(-lo * inverse);
    z = z < 0 ? 0 : (z > levels ? levels : z);
    for (int i = 0; i < k; i++) {
        float v = nearbyintf(x[i] * inverse) + (float)z;
        v = v < 0.f ? 0.f : (v > top ? top : v);
        q[i] = (uint8_t)v;
    }
    for (int i = k; i < k_padded; i++) q[i] = (uint8_t)z; /* the padded weights are 0 */
    *scale = norm_eps >= 0.f ? s / sqrtf(squares / (float)k + norm_eps) : s;
    *zero = z;
    return 1;
}

typedef int (*quantize_fn)(const float *x, int k, int k_padded, float norm_eps, uint8_t *q, float *scale,
                           int32_t *zero);

VNNI static int quantize_row_512(const float *x, int k, int k_padded, float norm_eps, uint8_t *q, float *scale,
                                 int32_t *zero) { /* 8-bit activations */
    return quantize_row(x, k, k_padded, norm_eps, 255, row_stats_512, q, scale, zero);
}

/* 7-bit activations: vpmaddubsw's int16 pairs do not saturate */
AVX2 static int quantize_row_256(const float *x, int k, int k_padded, float norm_eps, uint8_t *q, float *scale,
                                 int32_t *zero) {
    return quantize_row(x, k, k_padded, norm_eps, 127, row_stats_256, q, scale, zero);
}

typedef void (*block_fn)(const uint8_t *xq, int k_padded, int rows, const int8_t *w, const float *x_scale,
                         const int32_t *x_zero, const int *x_finite, const float *w_scale, const int32_t *w_sum,
                         const float *bias, float *y, int n, int first);

/* One block of 16 outputs for up to ROW_TILE rows; inlined with a constant count for whole tiles (see
 * `block_rows_256`). */
VNNI static inline __attribute__((always_inline)) void block_rows_512(const uint8_t *xq, int k_padded, int rows,
                                                                      const int8_t *w, const float *x_scale,
                                                                      const int32_t *x_zero, const int *x_finite,
                                                                      const float *w_scale, const int32_t *w_sum,
                                                                      const float *bias, float *y, int n,
                                                                      int first) {
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

VNNI static void block_product_512(const uint8_t *xq, int k_padded, int rows, const int8_t *w, const float *x_scale,
                                   const int32_t *x_zero, const int *x_finite, const float *w_scale,
                                   const int32_t *w_sum, const float *bias, float *y, int n, int first) {
    if (rows == ROW_TILE)
        block_rows_512(xq, k_padded, ROW_TILE, w, x_scale, x_zero, x_finite, w_scale, w_sum, bias, y, n, first);
    else
        block_rows_512(xq, k_padded, rows, w, x_scale, x_zero, x_finite, w_scale, w_sum, bias, y, n, first);
}

/* Row r's 16 outputs of the block at `first` from its int32 sums in two halves of 8: zero point,
 * scales and bias applied; NaN for a row that was not finite. */
AVX2 static void store_block_256(__m256i low, __m256i high, int r, const float *x_scale, const int32_t *x_zero,
                                 const int *x_finite, const float *w_scale, const int32_t *w_sum,
                                 const float *bias, float *y, int n, int first) {
    int valid = n - first < BLOCK ? n - first : BLOCK;
    float scale[BLOCK] = {0}, offset[BLOCK] = {0}, out[BLOCK];
    int32_t sum[BLOCK] = {0};
    for (int i = 0; i < valid; i++) {
        scale[i] = w_scale[first + i], sum[i] = w_sum[first + i];
        offset[i] = bias ? bias[first + i] : 0.f;
    }
    for (int half = 0; half < 2; half++) {
        __m256i acc = half ? high : low;
        __m256i weight_sum = _mm256_loadu_si256((const __m256i *)(sum + 8 * half));
        __m256i zero_sum = _mm256_mullo_epi32(_mm256_set1_epi32(x_zero[r]), weight_sum);
        __m256 row_scale = _mm256_mul_ps(_mm256_loadu_ps(scale + 8 * half), _mm256_set1_ps(x_scale[r]));
        __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc, zero_sum)), row_scale,
                                   _mm256_loadu_ps(offset + 8 * half));
        _mm256_storeu_ps(out + 8 * half, x_finite[r] ? v : _mm256_set1_ps(NAN));
    }
    memcpy(y + (size_t)r * n + first, out, (size_t)valid * sizeof(float));
}

/* One block of 16 outputs for up to ROW_TILE rows, in two halves of 8. Inlined into the wrapper below
 * with a constant count for whole tiles, so that the loops over rows unroll and the accumulators stay
 * in registers (with a variable count the compiler branched on it at every group of inputs). */
AVX2 static inline __attribute__((always_inline)) void block_rows_256(const uint8_t *xq, int k_padded, int rows,
                                                                      const int8_t *w, const float *x_scale,
                                                                      const int32_t *x_zero, const int *x_finite,
                                                                      const float *w_scale, const int32_t *w_sum,
                                                                      const float *bias, float *y, int n,
                                                                      int first) {
    __m256i low[ROW_TILE], high[ROW_TILE];
    for (int r = 0; r < ROW_TILE; r++) low[r] = high[r] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    const int32_t *groups = (const int32_t *)xq;
    int k4 = k_padded / 4;
    for (int g = 0; g < k4; g++) {
        const int8_t *at = w + (size_t)g * 64;
        _mm_prefetch((const char *)(at + PREFETCH), _MM_HINT_T1);
        __m256i w0 = _mm256_loadu_si256((const __m256i *)at), w1 = _mm256_loadu_si256((const __m256i *)(at + 32));
        for (int r = 0; r < rows; r++) {
            __m256i x4 = _mm256_set1_epi32(groups[r * k4 + g]);
            low[r] = _mm256_add_epi32(low[r], _mm256_madd_epi16(_mm256_maddubs_epi16(x4, w0), ones));
            high[r] = _mm256_add_epi32(high[r], _mm256_madd_epi16(_mm256_maddubs_epi16(x4, w1), ones));
        }
    }
    for (int r = 0; r < rows; r++)
        store_block_256(low[r], high[r], r, x_scale, x_zero, x_finite, w_scale, w_sum, bias, y, n, first);
}

AVX2 static void block_product_256(const uint8_t *xq, int k_padded, int rows, const int8_t *w, const float *x_scale,
                                   const int32_t *x_zero, const int *x_finite, const float *w_scale,
                                   const int32_t *w_sum, const float *bias, float *y, int n, int first) {
    if (rows == ROW_TILE)
        block_rows_256(xq, k_padded, ROW_TILE, w, x_scale, x_zero, x_finite, w_scale, w_sum, bias, y, n, first);
    else
        block_rows_256(xq, k_padded, rows, w, x_scale, x_zero, x_finite, w_scale, w_sum, bias, y, n, first);
}

/* One row, up to STREAMS neighbouring blocks (`count`) read side by side: on the AVX2-only AMD EPYC
 * several streams per thread read faster than one (gate/up 26-28 GB/s against 20-26, down 19-20
 * against 16-19, 24 one-row products in turn); the sums are the same integers. */
typedef void (*one_row_fn)(const uint8_t *xq, int k_padded, const int8_t *w, int count, const float *x_scale,
                           const int32_t *x_zero, const int *x_finite, const float *w_scale, const int32_t *w_sum,
                           const float *bias, float *y, int n, int first);

AVX2 static void one_row_blocks_256(const uint8_t *xq, int k_padded, const int8_t *w, int count,
                                    const float *x_scale, const int32_t *x_zero, const int *x_finite,
                                    const float *w_scale, const int32_t *w_sum, const float *bias, float *y, int n,
                                    int first) {
    __m256i acc[2 * STREAMS];
    for (int j = 0; j < 2 * STREAMS; j++) acc[j] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    const int32_t *groups = (const int32_t *)xq;
    size_t block_bytes = (size_t)k_padded * BLOCK;
    int k4 = k_padded / 4;
    for (int g = 0; g < k4; g++) {
        __m256i x4 = _mm256_set1_epi32(groups[g]);
        for (int j = 0; j < STREAMS; j++) { /* a missing block re-reads the first: its sums are dropped */
            const int8_t *at = w + (j < count ? j : 0) * block_bytes + (size_t)g * 64;
            __m256i w0 = _mm256_loadu_si256((const __m256i *)at), w1 = _mm256_loadu_si256((const __m256i *)(at + 32));
            acc[2 * j] = _mm256_add_epi32(acc[2 * j], _mm256_madd_epi16(_mm256_maddubs_epi16(x4, w0), ones));
            acc[2 * j + 1] = _mm256_add_epi32(acc[2 * j + 1], _mm256_madd_epi16(_mm256_maddubs_epi16(x4, w1), ones));
        }
    }
    for (int j = 0; j < count; j++)
        store_block_256(acc[2 * j], acc[2 * j + 1], 0, x_scale, x_zero, x_finite, w_scale, w_sum, bias, y, n,
                        first + j * BLOCK);
}

/* x (rows, k) float32, w packed as above for (n, k_padded), w_scale and w_sum (n,), bias (n,) or NULL,
 * y (rows, n) float32, scratch rows * k_padded bytes, norm_eps < 0 for no norm. Returns 0, or -1 for
 * arguments it cannot take. */
static int int8_linear(const float *x, int rows, int k, int k_padded, const int8_t *w, const float *w_scale,
                       const int32_t *w_sum, const float *bias, float *y, int n, int threads, uint8_t *scratch,
                       float norm_eps, quantize_fn quantize, block_fn block_product, one_row_fn one_row) {
    if (rows < 1 || rows > MAX_ROWS || k < 1 || k_padded < k || k_padded % 4 || n < 1 || threads < 1) return -1;
    float x_scale[MAX_ROWS];
    int32_t x_zero[MAX_ROWS];
    int x_finite[MAX_ROWS];
    for (int r = 0; r < rows; r++)
        x_finite[r] = quantize(x + (size_t)r * k, k, k_padded, norm_eps, scratch + (size_t)r * k_padded,
                               &x_scale[r], &x_zero[r]);
    int blocks = (n + BLOCK - 1) / BLOCK;
    if (rows == 1 && one_row) { /* decoding: STREAMS blocks at a time */
        int runs = (blocks + STREAMS - 1) / STREAMS;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int run = 0; run < runs; run++) {
            int b = run * STREAMS, count = blocks - b < STREAMS ? blocks - b : STREAMS;
            one_row(scratch, k_padded, w + (size_t)b * k_padded * BLOCK, count, x_scale, x_zero, x_finite, w_scale,
                    w_sum, bias, y, n, b * BLOCK);
        }
        return 0;
    }
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

/* Quantise the float32 weight w (n, k), times norm_weight (k,) per input when given, into the layout
 * above (`packed`: ceil(n / 16) * 16 * k_padded bytes, zeroed by the caller), with torch's arithmetic
 * (cosyserve.engine.native_int8 checked it bit for bit): per output channel scale = max |w| / 127, at
 * least 1e-12; q = w / scale rounded to nearest even, clamped to +-127; w_sum = the sum of a row's q.
 * One pass a row instead of ten torch passes over the whole matrix (4 s for the LM's 0.36 B weights on
 * an AVX2 EPYC, 2 threads). Returns 0, or -1 for arguments it cannot take. */
AVX2 int cosyserve_int8_pack(const float *w, int n, int k, int k_padded, const float *norm_weight, int8_t *packed,
                             float *scale, int32_t *w_sum, int threads) {
    if (n < 1 || k < 1 || k_padded < k || k_padded % 4 || threads < 1) return -1;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *row = malloc((size_t)k * sizeof(float));
        if (!row) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int j = 0; j < n; j++) {
            if (!row) continue;
            const float *source = w + (size_t)j * k;
            float largest = 0.f;
            for (int i = 0; i < k; i++) {
                row[i] = norm_weight ? source[i] * norm_weight[i] : source[i];
                float magnitude = fabsf(row[i]);
                largest = magnitude > largest ? magnitude : largest;
            }
            float s = largest / 127.f;
            s = s < 1e-12f ? 1e-12f : s;
            int32_t total = 0;
            int8_t *block = packed + (size_t)(j / BLOCK) * BLOCK * k_padded + (size_t)(j % BLOCK) * 4;
            for (int i = 0; i < k; i++) {
                float q = nearbyintf(row[i] / s);
                q = q < -127.f ? -127.f : (q > 127.f ? 127.f : q);
                block[(size_t)(i / 4) * BLOCK * 4 + i % 4] = (int8_t)q;
                total += (int32_t)q;
            }
            scale[j] = s, w_sum[j] = total;
        }
        free(row);
    }
    return failed ? -1 : 0;
}

/* 8-bit activations (0..255), AVX-512 VNNI. */
int cosyserve_int8_linear(const float *x, int rows, int k, int k_padded, const int8_t *w, const float *w_scale,
                          const int32_t *w_sum, const float *bias, float *y, int n, int threads, uint8_t *scratch,
                          float norm_eps) {
    return int8_linear(x, rows, k, k_padded, w, w_scale, w_sum, bias, y, n, threads, scratch, norm_eps,
                       quantize_row_512, block_product_512, NULL);
}

/* 7-bit activations (0..127), AVX2. */
int cosyserve_int8_linear_avx2(const float *x, int rows, int k, int k_padded, const int8_t *w, const float *w_scale,
                               const int32_t *w_sum, const float *bias, float *y, int n, int threads,
                               uint8_t *scratch, float norm_eps) {
    return int8_linear(x, rows, k, k_padded, w, w_scale, w_sum, bias, y, n, threads, scratch, norm_eps,
                       quantize_row_256, block_product_256, one_row_blocks_256);
}
