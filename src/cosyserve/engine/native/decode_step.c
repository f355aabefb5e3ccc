/* One LM decoding step through every decoder layer in one call, on AVX2, for one sequence or a batch of
 * them each at its own position (cosyserve.engine.native_step calls this; cosyserve.engine.native_int8
 * builds it into the same library as the other kernels).
 *
 * A decoding step of the 24-layer LM makes ~100 one-row products and, between them, ~15 small torch
 * calls a layer (splits, the residual adds, SiLU, the product of gate and up, the attention's call):
 * on an AVX2-only AMD EPYC with the int8 products that was ~7.7 ms of a 23.7 ms step in dispatch and
 * Python, for arithmetic worth well under a millisecond. Here a layer is
 *
 *   qkv = product(norm(x)); attn = attention(q, k, v) at `position`; x = x + product(attn)
 *   gu  = product(norm(x)); x = x + product(silu(gate) * up)
 *
 * with the products and the attention of the other C files (the same functions the per-call modules
 * use, so the same values), the norms inside the q/k/v and gate/up products, and the small steps in
 * float32 here, in torch's order: x + o, silu(g) = g / (1 + exp(-g)), then silu(g) * u, x + down. Only
 * the exponential differs from torch's (vector_exp.h's polynomial, within 2 ulp of expf, instead of
 * SLEEF's).
 *
 * Built with plain flags: functions carry their own target attributes, so the library loads on any
 * x86-64 CPU, and the caller only calls this where /proc/cpuinfo lists avx2 and fma (and avx512_vnni
 * for a layer with such products).
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "vector_exp.h"

#define AVX2 __attribute__((target("avx2,fma")))

/* The kernels of the other C files (one library). */
int cosyserve_int8_linear(const float *x, int rows, int k, int k_padded, const int8_t *w, const float *w_scale,
                          const int32_t *w_sum, const float *bias, float *y, int n, int threads, uint8_t *scratch,
                          float norm_eps);
int cosyserve_int8_linear_avx2(const float *x, int rows, int k, int k_padded, const int8_t *w, const float *w_scale,
                               const int32_t *w_sum, const float *bias, float *y, int n, int threads,
                               uint8_t *scratch, float norm_eps);
int cosyserve_f32_linear_avx2(const float *x, int rows, int k, const float *w, const float *bias, float *y, int n,
                              int threads, const float *norm_weight, float norm_eps, float *scratch);
int cosyserve_attend_new_position(const float *q, long q_stride, const float *k, long k_stride, const float *v,
                                  long v_stride, int rows, int heads, int kv_heads, int d, const float *cos,
                                  const float *signed_sin, float *keys, float *values, long batch_stride,
                                  long head_stride, int position, float *out, float *scores, int threads);

enum { INT8_VNNI = 1, INT8_AVX2 = 2, GEMV_AVX2 = 3 };
#define MAX_ROWS 16 /* rows a step takes: the float32 product's limit (f32_products.c) */

/* One product of a layer (cosyserve.engine.native_step's `_Product` mirrors this). */
typedef struct {
    int kind;               /* INT8_VNNI, INT8_AVX2 or GEMV_AVX2 */
    int in_features;        /* k */
    int padded_in;          /* int8: k rounded up to 4 (the packed layout's row) */
    int out_features;       /* n */
    const void *weight;     /* int8: the packed layout; float32: (n, k) as stored */
    const float *scale;     /* int8: (n,) per output channel */
    const int32_t *weight_sum; /* int8: (n,) */
    const float *bias;      /* (n,) or NULL */
    const float *norm_weight; /* float32 with a norm inside: (k,); int8 fold it into their weights */
    float norm_eps;         /* < 0: no norm */
} Product;

/* The four products of one decoder layer. */
typedef struct {
    Product qkv, o, gate_up, down;
} Layer;

static int run_product(const Product *p, const float *x, int rows, float *y, uint8_t *quantized, float *normed,
                       int threads) {
    switch (p->kind) {
    case INT8_VNNI:
        return cosyserve_int8_linear(x, rows, p->in_features, p->padded_in, p->weight, p->scale, p->weight_sum,
                                     p->bias, y, p->out_features, threads, quantized, p->norm_eps);
    case INT8_AVX2:
        return cosyserve_int8_linear_avx2(x, rows, p->in_features, p->padded_in, p->weight, p->scale,
                                          p->weight_sum, p->bias, y, p->out_features, threads, quantized,
                                          p->norm_eps);
    case GEMV_AVX2:
        return cosyserve_f32_linear_avx2(x, rows, p->in_features, p->weight, p->bias, y, p->out_features, threads,
                                         p->norm_eps >= 0.f ? p->norm_weight : NULL, p->norm_eps, normed);
    default:
        return -1;
    }
}

/* h[i] = silu(gate[i]) * up[i] (gate = gu[0..n), up = gu[n..2n)), rounded as torch rounds each step. */
AVX2 static void silu_times_up(const float *gu, int n, float *h) {
    const __m256 one = _mm256_set1_ps(1.f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gu + i);
        __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
        _mm256_storeu_ps(h + i, _mm256_mul_ps(silu, _mm256_loadu_ps(gu + n + i)));
    }
    if (i < n) { /* the tail through the same arithmetic */
        float g[8] = {0}, e[8];
        for (int j = 0; i + j < n; j++) g[j] = gu[i + j];
        _mm256_storeu_ps(e, exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(g))));
        for (int j = 0; i + j < n; j++) h[i + j] = (g[j] / (1.f + e[j])) * gu[n + i + j];
    }
}

static void add_into(float *x, const float *y, int n) {
    for (int i = 0; i < n; i++) x[i] += y[i];
}

/* x (rows, hidden) in place through `count` layers, row r at its own position positions[r] (one new
 * position per sequence: B = rows, T = 1; at most MAX_ROWS rows).
 *
 * cache: the LM's (layers, 2, rows, kv_heads, capacity, d) float32 cache, layer l's keys of row r at
 * cache + l * layer_stride + r * batch_stride, its values half_stride after, head g's position t at
 * + g * head_stride + t * d. cos_table, signed_sin_table: (positions, d) rotary tables, read at each
 * row's position. work: floats for the intermediate vectors, at least rows ((heads + 2 kv_heads) d +
 * heads d + hidden + 3 inner + max(hidden, inner)) + heads (largest position + 1); quantized: bytes for
 * the quantised rows, at least rows times the largest padded_in. Returns 0, the failing layer's index + 1
 * when a kernel refuses its arguments, or -1 for arguments this cannot take. */
AVX2 int cosyserve_decode_layers(const Layer *layers, int count, float *x, int rows, int hidden, int heads,
                                 int kv_heads, int d, int inner, float *cache, long layer_stride, long half_stride,
                                 long batch_stride, long head_stride, const float *cos_table,
                                 const float *signed_sin_table, const int64_t *positions, float *work,
                                 uint8_t *quantized, int threads) {
    if (count < 1 || rows < 1 || rows > MAX_ROWS || hidden < 1 || heads < 1 || kv_heads < 1 || inner < 1 ||
        threads < 1)
        return -1;
    for (int r = 0; r < rows; r++)
        if (positions[r] < 0 || positions[r] > INT32_MAX) return -1;
    int q_width = heads * d, kv_width = kv_heads * d, qkv_width = q_width + 2 * kv_width;
    int widest = hidden > inner ? hidden : inner;
    float *qkv = work, *attended = qkv + rows * qkv_width, *update = attended + rows * q_width;
    float *gu = update + rows * hidden, *h = gu + rows * 2 * inner, *normed = h + rows * inner;
    float *scores = normed + rows * widest;
    for (int l = 0; l < count; l++) {
        const Layer *layer = layers + l;
        if (run_product(&layer->qkv, x, rows, qkv, quantized, normed, threads)) return l + 1;
        for (int r = 0; r < rows; r++) { /* each row over its own keys, up to its own position */
            const float *q = qkv + r * qkv_width;
            float *keys = cache + l * layer_stride + r * batch_stride;
            int position = (int)positions[r];
            if (cosyserve_attend_new_position(q, 0, q + q_width, 0, q + q_width + kv_width, 0, 1, heads, kv_heads, d,
                                              cos_table + (long)position * d, signed_sin_table + (long)position * d,
                                              keys, keys + half_stride, 0, head_stride, position,
                                              attended + r * q_width, scores, threads))
                return l + 1;
        }
        if (run_product(&layer->o, attended, rows, update, quantized, normed, threads)) return l + 1;
        add_into(x, update, rows * hidden);
        if (run_product(&layer->gate_up, x, rows, gu, quantized, normed, threads)) return l + 1;
        for (int r = 0; r < rows; r++) silu_times_up(gu + r * 2 * inner, inner, h + r * inner);
        if (run_product(&layer->down, h, rows, update, quantized, normed, threads)) return l + 1;
        add_into(x, update, rows * hidden);
    }
    return 0;
}
