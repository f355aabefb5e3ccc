/* One core's peak multiply-add rates on AVX2, from registers only (no memory): what an int8 product
 * can gain over float32 on a CPU without VNNI.
 *
 *   gcc -O3 -o /tmp/cpu_peaks scripts/cpu_peaks.c && /tmp/cpu_peaks
 *
 * float32: `vfmadd` (8 lanes, 2 operations each). int8 as fbgemm and our int8_avx2 kernel multiply it:
 * `vpmaddubsw` (32 uint8 x int8 products summed in pairs into int16) then `vpmaddwd` by ones (into
 * int32) and `vpaddd`: 64 operations per 32 byte pairs. "int8, two products per int16" sums two
 * `vpmaddubsw` results before one `vpmaddwd`, which only fits in int16 with 7-bit activations and
 * 7-bit weights. Several independent chains per loop, so latency does not limit; an empty asm
 * statement keeps the compiler from hoisting the products out of the loop.
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define AVX2 __attribute__((target("avx2,fma")))
#define KEEP(...) __asm__ volatile("" : "+x"(w0), "+x"(w1), "+x"(w2), "+x"(w3), "+x"(w4), "+x"(w5), "+x"(x))

static double seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec + now.tv_nsec * 1e-9;
}

AVX2 static float float32_rate(long loops) {
    __m256 a0 = _mm256_set1_ps(0.1f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0;
    const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-4f);
    for (long i = 0; i < loops; i++) {
        a0 = _mm256_fmadd_ps(a0, b, c), a1 = _mm256_fmadd_ps(a1, b, c), a2 = _mm256_fmadd_ps(a2, b, c);
        a3 = _mm256_fmadd_ps(a3, b, c), a4 = _mm256_fmadd_ps(a4, b, c), a5 = _mm256_fmadd_ps(a5, b, c);
        a6 = _mm256_fmadd_ps(a6, b, c), a7 = _mm256_fmadd_ps(a7, b, c), a8 = _mm256_fmadd_ps(a8, b, c);
        a9 = _mm256_fmadd_ps(a9, b, c);
    }
    __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                               _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(_mm256_add_ps(a6, a7), _mm256_add_ps(a8, a9))));
    return _mm256_cvtss_f32(sum);
}

#define PAIR(acc, w) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w), ones))
#define TWO(acc, u, v) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(x, u), _mm256_maddubs_epi16(x, v)), ones))

AVX2 static int int8_rate(long loops, int two_per_int16) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m256i x = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    __m256i w0 = _mm256_set1_epi8(5), w1 = _mm256_set1_epi8(6), w2 = _mm256_set1_epi8(7);
    __m256i w3 = _mm256_set1_epi8(8), w4 = _mm256_set1_epi8(9), w5 = _mm256_set1_epi8(10);
    for (long i = 0; i < loops; i++) {
        KEEP();
        if (two_per_int16) {
            TWO(a0, w0, w1), TWO(a1, w2, w3), TWO(a2, w4, w5);
        } else {
            PAIR(a0, w0), PAIR(a1, w1), PAIR(a2, w2), PAIR(a3, w3), PAIR(a4, w4), PAIR(a5, w5);
        }
    }
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                   _mm256_add_epi32(a4, a5));
    return _mm256_extract_epi32(sum, 0);
}

int main(void) {
    const long loops = 100000000;
    double start = seconds();
    float f = float32_rate(loops);
    double float32 = loops * 10.0 * 16 / (seconds() - start) / 1e9;
    start = seconds();
    int a = int8_rate(loops, 0);
    double int8 = loops * 6.0 * 64 / (seconds() - start) / 1e9;
    start = seconds();
    int b = int8_rate(loops, 1);
    double int8_two = loops * 6.0 * 64 / (seconds() - start) / 1e9;
    printf("one core: float32 %.1f GFLOP/s; int8 (vpmaddubsw + vpmaddwd) %.1f GOP/s = %.2fx; "
           "int8, two products per int16 (7-bit weights) %.1f GOP/s = %.2fx   [%g %d %d]\n",
           float32, int8, int8 / float32, int8_two, int8_two / float32, f, a, b);
    return 0;
}
