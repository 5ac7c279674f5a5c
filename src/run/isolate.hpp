// --isolate (docs/plugins.md): one case measured in a forked child process, so that a plugin
// that crashes (a segfault, an abort) fails that case only and the run goes on. The child sends its
// record back through a pipe as the JSON of a journal line (src/results/record_json.cpp); a child that
// dies by a signal is a failed case naming the signal.
//
// libgomp cannot start threads in a forked child of a process whose threads it had started: the
// child's first parallel region would wait forever. So the parent computes what needs OpenMP (the
// inputs and the float64 reference) before the fork, the sgemm peak checks stay in the parent,
// and the child runs OpenMP on one thread: a plugin that parallelises with OpenMP runs serially
// under --isolate (one with its own threads does not).
#pragma once

#include <functional>

#include "src/results/record.hpp"

namespace lattn {

// The measurement `body` takes in a child process. Throws RuntimeFailure with the child's error,
// the signal that killed it, or how it ended without a record; Interrupted when SIGINT or SIGTERM
// asked the run to stop meanwhile.
Measurement run_isolated(const Case& kase, const std::function<Measurement()>& body);

}  // namespace lattn
