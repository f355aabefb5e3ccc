/* The attention of one new LM position over its KV cache, on AVX2 (cosyserve.engine.native_attention
 * calls this; cosyserve.engine.native_int8 builds it into the same library as the product kernels).
 *
 * In a decoding step the work between the matrix products is small but made of many small torch
 * calls: per layer the rotary embedding of q and k (a concatenation, two products and a sum each),
 * two cache writes, the query's scaling, two batched products over a few hundred keys and a softmax.
 * On an AVX2-only AMD EPYC those took ~5 ms of a 68 ms exact step (24 layers) in dispatch and in
 * MKL's batched product, which is slow at such small shapes. Here they are one call per layer.
 *
 * Per row and key/value head (one task each, spread over the threads): the new key is rotated and,
 * with the new value, written at `position`; then each query head of the group is rotated, scaled by
 * 1 / sqrt(head_dim), and attends over keys 0..position: scores (8 keys at a time), softmax (max
 * subtracted, exp, times the sum's inverse) and the weighted sum of the values, all in float32.
 * Rotation: x * cos + swap(x) * signed_sin, swap exchanging the two halves of the head
 * (cosyserve.model.qwen2's `_rotate`). Head sizes: multiples of 8 up to 256 (the LM's is 64).
 *
 * Built with plain flags: the function carries its own target attribute, so the library loads on any
 * x86-64 CPU, and the caller only calls it where /proc/cpuinfo lists avx2 and fma.
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>

#include "vector_exp.h"

#define AVX2 __attribute__((target("avx2,fma")))
#define MAX_HEAD_DIM 256 /* a multiple of 8 */

/* out = x * cos + swap(x) * signed_sin over one head of `d` values (d even). */
static void rotate(const float *x, const float *cos, const float *signed_sin, int d, float *out) {
    int half = d / 2;
    for (int i = 0; i < d; i++) {
        float swapped = i < half ? x[i + half] : x[i - half];
        out[i] = x[i] * cos[i] + swapped * signed_sin[i];
    }
}

/* Sum of the 8 lanes in a fixed tree: ((0+1)+(2+3)) + ((4+5)+(6+7)), as `scores8` sums each key. */
AVX2 static inline float lane_tree_sum(__m256 v) {
    float l[8];
    _mm256_storeu_ps(l, v);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* The query's dot product with 8 keys `d` floats apart (d a multiple of 8): 8 scores, each summed as
 * `lane_tree_sum` sums one key. */
AVX2 static inline __m256 scores8(const float *query, const float *keys, int d) {
    __m256 acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (int i = 0; i < d; i += 8) {
        __m256 qv = _mm256_loadu_ps(query + i);
        for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + (long)j * d + i), acc[j]);
    }
    /* hadd pairs lanes (0+1, 2+3) within each 128-bit half; twice gives (0+1)+(2+3) and (4+5)+(6+7) */
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

AVX2 static inline float score1(const float *query, const float *key, int d) {
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(query + i), _mm256_loadu_ps(key + i), acc);
    return lane_tree_sum(acc);
}

/* out (d) = sum_t p[t] * values[t] over `count` values `d` apart, 64 outputs (8 registers) a pass. */
AVX2 static void weighted_sum(const float *p, const float *values, int count, int d, float *out) {
    for (int i = 0; i < d; i += 64) {
        int width = d - i < 64 ? (d - i) / 8 : 8;
        __m256 acc[8];
        for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
        for (int t = 0; t < count; t++) {
            __m256 weight = _mm256_set1_ps(p[t]);
            const float *row = values + (long)t * d + i;
            for (int j = 0; j < width; j++) acc[j] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(row + 8 * j), acc[j]);
        }
        for (int j = 0; j < width; j++) _mm256_storeu_ps(out + i + 8 * j, acc[j]);
    }
}

/* Softmax of p[0..count) in place: max subtracted, exp, divided by the sum. */
AVX2 static void softmax(float *p, int count) {
    float top = -INFINITY;
    for (int t = 0; t < count; t++) top = p[t] > top || p[t] != p[t] ? p[t] : top;
    __m256 shift = _mm256_set1_ps(top), sums = _mm256_setzero_ps();
    int t = 0;
    for (; t + 8 <= count; t += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + t), shift));
        _mm256_storeu_ps(p + t, e);
        sums = _mm256_add_ps(sums, e);
    }
    float total = lane_tree_sum(sums);
    if (t < count) { /* the tail through the same exp: pad with -inf, which gives 0 */
        float tail[8];
        for (int j = 0; j < 8; j++) tail[j] = t + j < count ? p[t + j] - top : -INFINITY;
        __m256 e = exp8(_mm256_loadu_ps(tail));
        _mm256_storeu_ps(tail, e);
        for (int j = 0; t + j < count; j++) total += p[t + j] = tail[j];
    }
    float inverse = 1.f / total;
    for (t = 0; t < count; t++) p[t] *= inverse;
}

/* q (rows, heads * d), k and v (rows, kv_heads * d), each row `*_stride` floats after the previous;
 * cos and signed_sin (d,) at `position`; keys and values: the layer's cache, row r and head g's
 * position t at `keys + r * batch_stride + g * head_stride + t * d`; out (rows, heads * d); scores:
 * scratch of rows * heads * (position + 1) floats. Returns 0, or -1 for arguments it cannot take. */
AVX2 int cosyserve_attend_new_position(const float *q, long q_stride, const float *k, long k_stride, const float *v,
                                       long v_stride, int rows, int heads, int kv_heads, int d, const float *cos,
                                       const float *signed_sin, float *keys, float *values, long batch_stride,
                                       long head_stride, int position, float *out, float *scores, int threads) {
    if (rows < 1 || kv_heads < 1 || heads % kv_heads || d < 8 || d % 8 || d > MAX_HEAD_DIM || position < 0 ||
        threads < 1)
        return -1;
    int group = heads / kv_heads, count = position + 1;
    float scale = 1.f / sqrtf((float)d);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int task = 0; task < rows * kv_heads; task++) {
        int r = task / kv_heads, g = task % kv_heads;
        float *row_keys = keys + r * batch_stride + g * head_stride;
        float *row_values = values + r * batch_stride + g * head_stride;
        rotate(k + r * k_stride + g * d, cos, signed_sin, d, row_keys + (long)position * d);
        const float *new_value = v + r * v_stride + g * d;
        for (int i = 0; i < d; i++) row_values[(long)position * d + i] = new_value[i];
        for (int j = 0; j < group; j++) {
            int h = g * group + j;
            float query[MAX_HEAD_DIM];
            rotate(q + r * q_stride + h * d, cos, signed_sin, d, query);
            for (int i = 0; i < d; i++) query[i] *= scale;
            float *p = scores + ((long)r * heads + h) * count;
            int t = 0;
            for (; t + 8 <= count; t += 8) _mm256_storeu_ps(p + t, scores8(query, row_keys + (long)t * d, d));
            for (; t < count; t++) p[t] = score1(query, row_keys + (long)t * d, d);
            softmax(p, count);
            weighted_sum(p, row_values, count, d, out + (long)r * heads * d + h * d);
        }
    }
    return 0;
}
