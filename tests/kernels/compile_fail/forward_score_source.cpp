// A score source whose modifiers lack for_row_runs: the forward could not narrow a key tile
// to the rows that see it.
#include "common.hpp"
using namespace kernels_case;
struct NoRowRuns {
  ops::ScoreModifiers builtin;
  const ops::KeyWindow& window() const { return builtin.window(); }
  float to_log2() const { return builtin.to_log2(); }
  bool skips(const ops::PackedRows&, index_t, index_t) const { return false; }
  template <class S, class Io>
  void apply(S& s, const ops::PackedRows& rows, index_t col0, Io& io) const { builtin.apply(s, rows, col0, io); }
};
struct NoRowRunsScores : ops::BuiltinScores {
  template <class P>
  NoRowRuns operator()(const P& p, index_t sequence, const tileattn::SequenceRange& seq) const {
    return {ops::ScoreModifiers(p, sequence, seq)};
  }
};
void call() { kernels::run_forward<tileattn::NoIoCounting>(forward_params, tile_plan, execution, NoRowRunsScores{}); }
