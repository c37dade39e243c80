// tileattn/memory/cache_size.hpp: detects the per-core cache that sizes each worker's SRAM budget.
#pragma once

#include <cstddef>
#include <fstream>
#include <string>

#if defined(__unix__)
#include <unistd.h>
#endif

namespace tileattn {

/// Used when the cache size cannot be read (256 KiB: the smallest L2 of any recent x86 core).
inline constexpr std::size_t fallback_cache_bytes = 256 * 1024;

namespace detail {

inline std::size_t parse_cache_size(const std::string& text) {
  std::size_t value = 0;
  std::size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') value = value * 10 + static_cast<std::size_t>(text[i++] - '0');
  if (i < text.size() && (text[i] == 'K' || text[i] == 'k')) value *= 1024;
  if (i < text.size() && (text[i] == 'M' || text[i] == 'm')) value *= 1024 * 1024;
  return value;
}

/// Linux sysfs: cpu0's unified level-2 cache.
inline std::size_t sysfs_l2_bytes() {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level(dir + "level"), size(dir + "size");
    std::string level_text, size_text;
    if (!(level >> level_text) || !(size >> size_text)) continue;
    if (level_text == "2") return parse_cache_size(size_text);
  }
  return 0;
}

}  // namespace detail

/// The per-core L2 cache in bytes: what plays the GPU's SRAM for one worker.
inline std::size_t per_core_cache_bytes() {
  static const std::size_t bytes = [] {
    std::size_t b = detail::sysfs_l2_bytes();
#if defined(_SC_LEVEL2_CACHE_SIZE)
    if (b == 0) {
      const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
      if (v > 0) b = static_cast<std::size_t>(v);
    }
#endif
    return b > 0 ? b : fallback_cache_bytes;
  }();
  return bytes;
}

}  // namespace tileattn
