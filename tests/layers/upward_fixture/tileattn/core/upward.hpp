// tests/layers/upward_fixture/tileattn/core/upward.hpp: a core header that includes memory,
// which scripts/check_layers.py must report (tests/layers/CMakeLists.txt). Never compiled.
#pragma once
#include "tileattn/memory/scratch_arena.hpp"
