// tileattn/version.hpp: the library version.
#pragma once

#define TILEATTN_VERSION_MAJOR 0
#define TILEATTN_VERSION_MINOR 1
#define TILEATTN_VERSION_PATCH 0

namespace tileattn {
inline constexpr const char* version = "0.1.0";
}  // namespace tileattn
