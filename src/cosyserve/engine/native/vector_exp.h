/* exp(x) on 8 floats (AVX2) and on 16 (AVX-512), for the compiled kernels that need one (their C files
 * include this).
 *
 * Within 2 ulp of expf for x in [-87.3, 88.3]: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its degree-6
 * Taylor polynomial, times 2^n. Below -87.3 it returns 0 (expf: subnormals or 0), above 88.3 +inf
 * (exp8; exp16 serves softmax rows whose maximum was subtracted, x <= 0); NaN stays NaN. */
#ifndef COSYSERVE_VECTOR_EXP_H
#define COSYSERVE_VECTOR_EXP_H
#include <immintrin.h>
#include <math.h>

__attribute__((target("avx2,fma"))) static inline __m256 exp8(__m256 x) {
    const __m256 lowest = _mm256_set1_ps(-87.3f), highest = _mm256_set1_ps(88.3f);
    __m256 underflow = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ), overflow = _mm256_cmp_ps(x, highest, _CMP_GT_OQ);
    x = _mm256_min_ps(highest, _mm256_max_ps(lowest, x)); /* NaN (second operand) passes through both */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x); /* ln2 in two parts: exact first step */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 poly = _mm256_set1_ps(1.f / 720.f);
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.f / 120.f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.f / 24.f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.f / 6.f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(0.5f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.f));
    __m256i power = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 result = _mm256_andnot_ps(underflow, _mm256_mul_ps(poly, _mm256_castsi256_ps(power)));
    return _mm256_blendv_ps(result, _mm256_set1_ps(INFINITY), overflow);
}

/* exp8's arithmetic on 16 floats; 2^n by scalef. */
__attribute__((target("avx512f"))) static inline __m512 exp16(__m512 x) {
    const __m512 lowest = _mm512_set1_ps(-87.3f);
    __mmask16 underflow = _mm512_cmp_ps_mask(x, lowest, _CMP_LT_OQ);
    x = _mm512_max_ps(lowest, x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 poly = _mm512_set1_ps(1.f / 720.f);
    static const float taylor[] = {1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f};
    for (int i = 0; i < 6; i++) poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(taylor[i]));
    return _mm512_maskz_mov_ps((__mmask16)~underflow, _mm512_scalef_ps(poly, n));
}

#endif
