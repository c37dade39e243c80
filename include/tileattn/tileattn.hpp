// tileattn/tileattn.hpp: the umbrella header: includes the whole public API.
#pragma once

#include "tileattn/autograd.hpp"
#include "tileattn/backend/execution.hpp"
#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/cache_write.hpp"
#include "tileattn/core/error.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/limits.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/strided_view.hpp"
#include "tileattn/forward.hpp"
#include "tileattn/kv_cache.hpp"
#include "tileattn/kernels/tile_plan.hpp"
#include "tileattn/memory/io_counter.hpp"
#include "tileattn/paged.hpp"
#include "tileattn/version.hpp"
