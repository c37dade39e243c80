// A score source without has_slope(softcap): the backward could not tell whether to carve a
// tile for the derivative of the modified score.
#include "common.hpp"
using namespace kernels_case;
struct NoSlopeScores {
  template <class P>
  ops::ScoreModifiers operator()(const P& p, index_t sequence, const tileattn::SequenceRange& seq) const {
    return {p, sequence, seq};
  }
  template <class P>
  void check(const P&, index_t, index_t) const {}
};
void call() { kernels::run_backward<tileattn::NoIoCounting>(backward_params, backward_plan, execution, NoSlopeScores{}); }
