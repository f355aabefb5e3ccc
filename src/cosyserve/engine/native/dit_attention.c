/* The DiT's attention with bfloat16 products on AVX-512 BF16 (cosyserve.engine.native_dit_attention
 * calls this; cosyserve.engine.native_int8 builds it into the same library as the other kernels).
 *
 * out[b, t, h * 64 + d] = sum_j softmax_j(q[b, h, t] . k[b, h, j] / 8) v[b, h, j, d]
 *
 * for every frame t of every head h of every batch row b, over all keys j (no mask), head size 64.
 * Why: on an AMD EPYC with avx512_bf16 but no AMX, the fast preset's DiT runs its linears in int8,
 * and torch's float32 attention (SDPA's flash kernel, 2 x 16 heads x 800 frames: 33-37 ms a call,
 * the same in bfloat16 there) took 43 % of a guided DiT pass. `vdpbf16ps` multiplies bfloat16 pairs
 * at twice float32's FMA rate and sums them in float32.
 *
 * Arithmetic: q (scaled by 1/8, exact in binary), k and v are rounded to bfloat16 (to nearest, ties to
 * even); each score is a float32 sum of bfloat16 products; the softmax runs in float32 (the row's
 * maximum subtracted, exp within 2 ulp, the row's sum); the probabilities are rounded to bfloat16 for
 * the weighted sum of the values, which is summed in float32 and divided by the float32 sum. That is
 * what a bfloat16 flash attention computes; it is not bit-exact, and is used by the fast preset only.
 *
 * Work: first every (b, h)'s keys and values are rounded and laid out in the order `vdpbf16ps`
 * reads them (keys: per block of 16 keys, per pair of dimensions, the 16 keys' two values; values: per
 * pair of keys, per dimension, the two keys' values), keys padded with zeros to a multiple of 32;
 * then each task takes ROWS query frames of one head: all their scores (a row of the keys at a time
 * in a per-thread buffer), the softmax, and the weighted sum, 4 rows x 64 dimensions in registers.
 *
 * Built with plain flags: the function carries its own target attribute, so the library loads on any
 * x86-64 CPU, and the caller only calls it where /proc/cpuinfo lists avx512f, avx512bw, avx512vl and
 * avx512_bf16.
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_exp.h"

#define BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define HEAD_DIM 64 /* the DiT's; other sizes go torch's way */
#define PAIRS (HEAD_DIM / 2)
#define KEYS 16 /* keys per block: one register of scores */
#define ROWS 8  /* query frames a task: they share each load of a key block */

/* float -> bfloat16, to nearest with ties to even (NaN stays a quiet NaN), as vcvtneps2bf16 rounds. */
static inline uint16_t to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

static inline uint32_t pair_bf16(float low, float high) {
    return (uint32_t)to_bf16(low) | ((uint32_t)to_bf16(high) << 16);
}

/* One (b, h)'s keys and values laid out for vdpbf16ps: keys (blocks, PAIRS, KEYS) and values
 * (key pairs, HEAD_DIM) of uint32 bfloat16 pairs; padding keys are zeros. */
static void pack_head(const float *k, const float *v, long frame_stride, int frames, int padded,
                      uint32_t *keys, uint32_t *values) {
    for (int j = 0; j < padded; j++) {
        const float *key = k + (long)j * frame_stride;
        uint32_t *block = keys + (long)(j / KEYS) * PAIRS * KEYS + j % KEYS;
        for (int p = 0; p < PAIRS; p++) block[p * KEYS] = j < frames ? pair_bf16(key[2 * p], key[2 * p + 1]) : 0u;
    }
    for (int j = 0; j < padded; j += 2) {
        uint32_t *pair = values + (long)(j / 2) * HEAD_DIM;
        for (int d = 0; d < HEAD_DIM; d++) {
            float first = j < frames ? v[(long)j * frame_stride + d] : 0.f;
            float second = j + 1 < frames ? v[(long)(j + 1) * frame_stride + d] : 0.f;
            pair[d] = pair_bf16(first, second);
        }
    }
}

/* Scores of `rows` query rows (their bfloat16 pairs, PAIRS each) against every key block. */
BF16 static void scores(const uint32_t *query, int rows, const uint32_t *keys, int blocks, float *out,
                        int padded) {
    for (int block = 0; block < blocks; block++) {
        const uint32_t *kb = keys + (long)block * PAIRS * KEYS;
        __m512 acc[ROWS];
        for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
        for (int p = 0; p < PAIRS; p++) {
            __m512bh key = (__m512bh)_mm512_loadu_si512(kb + p * KEYS);
            for (int r = 0; r < ROWS; r++)
                if (r < rows) acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32((int)query[r * PAIRS + p]), key);
        }
        for (int r = 0; r < rows; r++) _mm512_storeu_ps(out + (long)r * padded + block * KEYS, acc[r]);
    }
}

/* Softmax of one row of scores in place as bfloat16 pairs of probabilities (`pairs` out, padded/2 of
 * them, padding zero); returns the float32 sum they are divided by. */
BF16 static float softmax_row(float *row, int frames, int padded, uint32_t *pairs) {
    for (int j = frames; j < padded; j++) row[j] = -INFINITY;
    __m512 high = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < padded; j += KEYS) high = _mm512_max_ps(high, _mm512_loadu_ps(row + j));
    __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(high)), sum = _mm512_setzero_ps();
    for (int j = 0; j < padded; j += 2 * KEYS) {
        __m512 a = exp16(_mm512_sub_ps(_mm512_loadu_ps(row + j), top));
        __m512 b = exp16(_mm512_sub_ps(_mm512_loadu_ps(row + j + KEYS), top)); /* padded: a multiple of 32 */
        sum = _mm512_add_ps(sum, _mm512_add_ps(a, b));
        /* 32 bfloat16 in key order: a's 16 then b's 16, i.e. 16 pairs (j, j+1), ... */
        _mm512_storeu_si512(pairs + j / 2, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
    return _mm512_reduce_add_ps(sum);
}

/* out rows += probabilities . values for up to 4 rows at once, each HEAD_DIM wide, then / sum. */
BF16 static void weighted_sum(const uint32_t *probs, int rows, long pair_stride, int key_pairs,
                              const uint32_t *values, const float *sums, float *out, long out_stride) {
    for (int r0 = 0; r0 < rows; r0 += 4) {
        __m512 acc[4][4];
        for (int r = 0; r < 4; r++)
            for (int q = 0; q < 4; q++) acc[r][q] = _mm512_setzero_ps();
        int count = rows - r0 < 4 ? rows - r0 : 4;
        for (int jp = 0; jp < key_pairs; jp++) {
            const uint32_t *pair = values + (long)jp * HEAD_DIM;
            __m512bh v0 = (__m512bh)_mm512_loadu_si512(pair), v1 = (__m512bh)_mm512_loadu_si512(pair + 16);
            __m512bh v2 = (__m512bh)_mm512_loadu_si512(pair + 32), v3 = (__m512bh)_mm512_loadu_si512(pair + 48);
            for (int r = 0; r < 4; r++) {
                if (r >= count) break;
                __m512bh p = (__m512bh)_mm512_set1_epi32((int)probs[(long)(r0 + r) * pair_stride + jp]);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], p, v0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], p, v1);
                acc[r][2] = _mm512_dpbf16_ps(acc[r][2], p, v2);
                acc[r][3] = _mm512_dpbf16_ps(acc[r][3], p, v3);
            }
        }
        for (int r = 0; r < count; r++) {
            __m512 inverse = _mm512_set1_ps(1.f / sums[r0 + r]);
            float *row = out + (long)(r0 + r) * out_stride;
            for (int q = 0; q < 4; q++) _mm512_storeu_ps(row + 16 * q, _mm512_mul_ps(acc[r][q], inverse));
        }
    }
}

/* q (B, H, Tq, 64), k and v (B, H, Tk, 64), float32, each with its own batch/head/frame strides (in
 * floats; the last dimension contiguous); out (B, Tq, H * 64) float32, contiguous. Returns 0, or -1
 * for arguments it cannot take (nothing written), -2 when memory ran out. */
BF16 int cosyserve_dit_attention_bf16(const float *q, const long *q_strides, const float *k,
                                      const long *k_strides, const float *v, const long *v_strides, int batch,
                                      int heads, int frames_q, int frames_k, int head_dim, float *out,
                                      int threads) {
    if (head_dim != HEAD_DIM || batch < 1 || heads < 1 || frames_q < 1 || frames_k < 1 || threads < 1)
        return -1;
    int padded = (frames_k + 2 * KEYS - 1) / (2 * KEYS) * (2 * KEYS), blocks = padded / KEYS; /* 32s: softmax_row */
    long head_words = (long)padded * PAIRS; /* keys' and values' uint32 per (b, h) each */
    long heads_total = (long)batch * heads;
    uint32_t *keys = aligned_alloc(64, (size_t)(heads_total * head_words * 2 * sizeof(uint32_t)));
    if (keys == NULL) return -2;
    uint32_t *values = keys + heads_total * head_words;
    int status = 0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long bh = 0; bh < heads_total; bh++) {
        long b = bh / heads, h = bh % heads;
        pack_head(k + b * k_strides[0] + h * k_strides[1], v + b * v_strides[0] + h * v_strides[1],
                  k_strides[2], frames_k, padded, keys + bh * head_words, values + bh * head_words);
    }
    long tiles = (frames_q + ROWS - 1) / ROWS, tasks = heads_total * tiles;
#pragma omp parallel num_threads(threads)
    {
        float *row_scores = aligned_alloc(64, (size_t)ROWS * padded * sizeof(float));
        uint32_t *probs = aligned_alloc(64, (size_t)ROWS * (padded / 2) * sizeof(uint32_t));
        if (row_scores == NULL || probs == NULL) {
#pragma omp atomic write
            status = -2;
        }
#pragma omp for schedule(static)
        for (long task = 0; task < tasks; task++) {
            if (row_scores == NULL || probs == NULL) continue;
            long bh = task / tiles, b = bh / heads, h = bh % heads;
            int first = (int)(task % tiles) * ROWS, rows = frames_q - first < ROWS ? frames_q - first : ROWS;
            uint32_t query[ROWS * PAIRS];
            float sums[ROWS];
            for (int r = 0; r < rows; r++) {
                const float *row = q + b * q_strides[0] + h * q_strides[1] + (long)(first + r) * q_strides[2];
                for (int p = 0; p < PAIRS; p++) query[r * PAIRS + p] = pair_bf16(row[2 * p] * 0.125f, row[2 * p + 1] * 0.125f);
            }
            scores(query, rows, keys + bh * head_words, blocks, row_scores, padded);
            for (int r = 0; r < rows; r++)
                sums[r] = softmax_row(row_scores + (long)r * padded, frames_k, padded, probs + (long)r * (padded / 2));
            float *dest = out + (b * frames_q + first) * (long)heads * HEAD_DIM + h * HEAD_DIM;
            weighted_sum(probs, rows, padded / 2, padded / 2, values + bh * head_words, sums, dest,
                         (long)heads * HEAD_DIM);
        }
        free(row_scores);
        free(probs);
    }
    free(keys);
    return status;
}
