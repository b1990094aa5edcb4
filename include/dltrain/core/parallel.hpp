// The CPU thread pool every CPU kernel runs on.
//
// Its size is DLTRAIN_NUM_THREADS (default: usable_cpus(), the CPUs this process may run
// on, not the node's core count) and can be changed at run time with set_num_threads. parallel_for
// splits a range into at most num_threads() contiguous chunks; a call made from inside a pool task
// runs inline, so kernels may nest without deadlock.
#pragma once

#include <cstdint>
#include <functional>

namespace dltrain {

/// Number of CPUs this process may run on: its affinity mask (sched_getaffinity, which
/// mpirun/srun binding and taskset narrow), capped by SLURM_CPUS_PER_TASK when that is set.
/// At least 1.
int usable_cpus();
/// True when DLTRAIN_NUM_THREADS or set_num_threads chose the thread count explicitly
/// (distributed::init then leaves it alone).
bool num_threads_set_explicitly();

/// Number of threads CPU kernels use.
int get_num_threads();
/// Sets the number of CPU threads (>= 1). Throws dltrain::Error otherwise.
void set_num_threads(int n);

/// Runs f(begin_chunk, end_chunk) over [begin, end) split into chunks of at least
/// `grain` iterations, in parallel on the pool. Exceptions propagate to the caller.
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& f);

/// True while the calling thread is executing a parallel_for chunk.
bool in_parallel_region();

namespace detail {
/// Runs `f` once on every thread of the compute team that parallel_for uses (the OpenMP team
/// of the widest size in use, or the own pool), the calling thread included; `f` must not
/// throw. For per-thread state such as signal masks (train::PreemptionHandler).
void for_each_compute_thread(const std::function<void()>& f);
}  // namespace detail

}  // namespace dltrain
