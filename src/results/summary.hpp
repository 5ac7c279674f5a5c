// The answer users came for: per shape and mode, which impl is fastest, by what factor and at what
// memory cost against the other, and where along seq the winner changes; and the warnings about
// the peak the records are held against.
#pragma once

#include <string>
#include <vector>

#include "src/results/record.hpp"

namespace lattn {

// Shape keys of a record without its impl (and, for a series, without seq), as one string: two
// records of one shape have the same key.
std::string shape_key(const Case& kase, bool with_seq);

// Whether the fastest and the runner-up of a comparison are within noise: their quartile ranges
// overlap (compare.py's "tie" from the same figures). The summary then says "tie", not "1.01x".
bool is_tie(const Comparison& comparison);

std::string format_summary(const Summary& summary);

// A warning when records ran above their compute ceiling (above_ceiling: `peak_fraction` over
// kAboveCeiling): the ceiling was then measured in a busier stretch than they ran in. Empty when
// none did.
std::string above_peak_warning(const std::vector<CaseRecord>& records, const ComputeCeiling& ceiling,
                               double fma_gflops, double sgemm_gflops);

// A warning when the start-up sgemm products spread widely (their median under 0.9 of their
// best): the machine's own rate moved while the peak was measured, so a case that ran exactly as
// fast as sgemm did at its median would read blas_fraction of about that ratio. Empty otherwise,
// or when either figure is missing.
std::string peak_spread_warning(double peak_gflops, double median_gflops);

}  // namespace lattn
