// tileattn/arch/avx512/dropout_bits.hpp (part of arch/avx512/set.hpp): dropout's keep bits
// (arch/philox.hpp) from Philox 4x32-10 calls side by side, and their application to rows of
// probabilities with masked moves. The same integers as generic's, so the same decisions on
// every set.
//
// A block of 128 keys is 8 calls (counter word 0 = 8 b + l for lane l), whose four words
// live in the low halves of the 8 64-bit lanes of a vector each: one vpmuludq gives a word's
// whole 64-bit product, whose low half is the next round's word as it stands (vpmuludq reads
// only low halves, so the high halves may hold anything), and one shift its high half: 6
// instructions a round for a block. Rounds depend on each other, so four blocks (of one row
// or several) go through the rounds together: four independent chains hide the multiplies'
// latency. At the end a permute packs words 0 and 1 (2 and 3) of the 8 calls into 16
// lanes, whose 64 bytes are keys 0-63 (64-127) of the block in order, and one byte compare
// (AVX-512 BW) makes their 64 bits.

namespace detail {

/// 8 Philox calls: their four 32-bit words in the low halves of 64-bit lanes.
struct PhiloxLanes {
  __m512i c0, c1, c2, c3;
};

/// (The zero-masked forms throughout: GCC 12 warns of the unmasked ones' undefined pass-through.)
inline __m512i mul_lo32(__m512i a, __m512i m) { return _mm512_maskz_mul_epu32(0xFF, a, m); }
inline __m512i high32(__m512i a) { return _mm512_maskz_srli_epi64(0xFF, a, 32); }

/// One round: c0, c2 times the multipliers; words (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0).
inline void philox_round(PhiloxLanes& s, __m512i k0, __m512i k1, __m512i m0, __m512i m1) {
  constexpr int xor3 = 0x96;
  const __m512i p0 = mul_lo32(s.c0, m0), p1 = mul_lo32(s.c2, m1);
  s.c0 = _mm512_ternarylogic_epi64(high32(p1), s.c1, k0, xor3);
  s.c1 = p1;
  s.c2 = _mm512_ternarylogic_epi64(high32(p0), s.c3, k1, xor3);
  s.c3 = p0;
}

/// Block `block` of `row`: its 8 calls.
inline void philox_start(const DropoutRow& row, index_t block, PhiloxLanes& a) {
  const __m512i lane = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  a.c0 = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(static_cast<std::uint32_t>(block * 8))), lane);
  a.c1 = _mm512_set1_epi64(row.query);
  a.c2 = _mm512_set1_epi64(row.stream);
  a.c3 = _mm512_set1_epi64(row.offset);
}

/// A block's 128 decisions into bits[0], bits[1]: the bytes of words (0, 1), then (2, 3),
/// of the 8 calls, packed, are the block's keys in order (arch/philox.hpp).
inline void store_keep_bits(const PhiloxLanes& a, std::uint32_t threshold, std::uint64_t* bits) {
  const __m512i pack = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i t = _mm512_set1_epi8(static_cast<char>(threshold));
  bits[0] = _mm512_cmpge_epu8_mask(_mm512_permutex2var_epi32(a.c0, pack, a.c1), t);
  bits[1] = _mm512_cmpge_epu8_mask(_mm512_permutex2var_epi32(a.c2, pack, a.c3), t);
}

/// `count` (16 or 32) bits from bit `i` of `bits` on (the buffer readable 8 bytes past byte i / 8).
inline std::uint32_t bits_at(const std::uint64_t* bits, index_t i, int count) {
  std::uint64_t window = 0;
  std::memcpy(&window, reinterpret_cast<const unsigned char*>(bits) + (i >> 3), count == 16 ? 4 : 8);
  return static_cast<std::uint32_t>(window >> (i & 7)) & (count == 16 ? 0xFFFFu : 0xFFFFFFFFu);
}

}  // namespace detail

#if TILEATTN_AVX512_HAS_BW_VL
inline void dropout_keep_bits(const DropoutRow* streams, index_t n, index_t first_block, index_t blocks,
                              std::uint64_t* bits, index_t ld) {
  constexpr index_t chains = 4;  // (row, block) items through the rounds together
  const __m512i m0 = _mm512_set1_epi64(philox_m0), m1 = _mm512_set1_epi64(philox_m1);
  const __m512i w0 = _mm512_set1_epi64(philox_w0), w1 = _mm512_set1_epi64(philox_w1);
  const index_t items = n * blocks;
  for (index_t item0 = 0; item0 < items; item0 += chains) {
    detail::PhiloxLanes s[chains];
    for (index_t c = 0; c < chains; ++c) {  // past the last item: the last again, not stored
      const index_t item = item0 + c < items ? item0 + c : items - 1;
      detail::philox_start(streams[item / blocks], first_block + item % blocks, s[c]);
    }
    __m512i k0 = _mm512_set1_epi64(streams[0].key0), k1 = _mm512_set1_epi64(streams[0].key1);  // one seed
    for (int r = 0; r < philox_rounds; ++r) {
      if (r > 0) {
        k0 = _mm512_add_epi64(k0, w0);  // the high halves carry: only the low ones are read
        k1 = _mm512_add_epi64(k1, w1);
      }
      for (detail::PhiloxLanes& lanes : s) detail::philox_round(lanes, k0, k1, m0, m1);
    }
    for (index_t c = 0; c < chains && item0 + c < items; ++c) {
      const index_t item = item0 + c;
      detail::store_keep_bits(s[c], streams[item / blocks].threshold,
                              bits + (item / blocks) * ld + dropout_block_words * (item % blocks));
    }
  }
}

#else
using generic::dropout_keep_bits;  // (no byte compares without AVX-512 BW: the scalar one)
#endif

inline void apply_keep_bits(float* x, index_t n, const std::uint64_t* bits, index_t bit0, float kept_scale) {
  using detail::lanes;
  const __m512 scale = _mm512_set1_ps(kept_scale);
  for (index_t j = 0; j < n; j += lanes) {
    const __mmask16 live = detail::first_lanes(n - j < lanes ? n - j : lanes);
    const auto keep = static_cast<__mmask16>(detail::bits_at(bits, bit0 + j, 16));
    const __m512 v = _mm512_maskz_loadu_ps(live, x + j);
    _mm512_mask_storeu_ps(x + j, live, _mm512_mul_ps(v, _mm512_maskz_mov_ps(keep, scale)));  // dropped: x * 0
  }
}

#if TILEATTN_AVX512_HAS_BW_VL
inline void apply_keep_bits(bf16x2* x, index_t n, const std::uint64_t* bits, index_t bit0) {
  auto* keys = reinterpret_cast<std::uint16_t*>(x);
  for (index_t j = 0; j < n; j += 32) {
    const index_t count = n - j < 32 ? n - j : 32;
    const __mmask32 live = count == 32 ? ~__mmask32{0} : (__mmask32{1} << count) - 1;
    const auto drop = static_cast<__mmask32>(~detail::bits_at(bits, bit0 + j, 32)) & live;
    // Dropped: x * 0 (generic::dropped): +0, or a quiet NaN where the half is NaN or Inf.
    const __m512i v = _mm512_maskz_loadu_epi16(drop, keys + j);
    const __mmask32 nonfinite = _mm512_mask_cmpge_epu16_mask(
        drop, _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF)), _mm512_set1_epi16(0x7F80));
    _mm512_mask_storeu_epi16(keys + j, drop, _mm512_maskz_mov_epi16(nonfinite, _mm512_or_si512(v, _mm512_set1_epi16(0x0040))));
  }
}
#else
inline void apply_keep_bits(bf16x2* x, index_t n, const std::uint64_t* bits, index_t bit0) {
  generic::apply_keep_bits(x, n, bits, bit0);
}
#endif
