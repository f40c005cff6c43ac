// Autotuning (HOROVOD_AUTOTUNE=1): while the job trains, tries fusion thresholds and cycle times
// chosen by Bayesian optimisation, then the response cache off and on, scores each by the bytes
// of allreduce data executed per second of wall time, and keeps the best.
//
// Lives on rank 0 of the global set only: it decides, and the controller carries its choice to
// every rank inside the next negotiation round (see tuned_parameters.h), so that all ranks
// switch in the same round.
//
// What a step is: the training step is not visible to the core, so, as in Horovod, it is
// inferred from tensor names: a step ends when a tensor already reduced since the step began
// is reduced again (a training loop reduces each gradient once per step, under the same name).
// A sample is `steps_per_sample` such steps, timed from the round that put its parameters in
// force; the first `warmup_samples` are discarded. Allreduces with names that never repeat
// (unnamed ones get a fresh name each call) do not advance the tuning.
#pragma once

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "bayesian_optimizer.h"
#include "../common/env_config.h"
#include "message.h"
#include "tuned_parameters.h"

namespace horovodlike {

class ParameterManager {
 public:
  using Clock = std::chrono::steady_clock;

  // The space searched: fusion thresholds and cycle times on a log scale.
  static constexpr double kMinFusionBytes = 64.0 * 1024;
  static constexpr double kMaxFusionBytes = 256.0 * 1024 * 1024;
  static constexpr double kMinCycleMs = 0.5;
  static constexpr double kMaxCycleMs = 50.0;

  struct Sample {
    TunedParameters parameters;
    double score = 0;  // bytes per second
  };

  // `initial`: the configured parameters, the first point scored. Throws InvalidArgument when
  // HOROVOD_AUTOTUNE_LOG cannot be written.
  ParameterManager(const Config& config, TunedParameters initial);

  // What the next round should carry.
  const TunedParameters& current() const { return current_; }
  bool tuning() const { return current_.tuning; }

  // Called before each round of the global set: a sample whose parameters were just chosen
  // starts its clock here, when the round that applies them begins.
  void RoundStarted(Clock::time_point now);
  // An allreduce ran on process set `set_id` over the tensors of `parts` (one response each,
  // see Controller::Round).
  void ObserveAllreduce(int set_id, const Response* const* parts, size_t count,
                        Clock::time_point now);
  // Scores the parameters in force (discarded while warming up) and chooses the next ones;
  // after the last sample fixes the best. Public so that tests can drive it with a synthetic
  // score.
  void RecordScore(double score);

  const std::vector<Sample>& samples() const { return samples_; }
  const Sample& best() const { return samples_.at(best_index_); }

 private:
  // The free variables (those the user did not set explicitly), normalised to [0, 1].
  std::vector<double> Normalise(const TunedParameters& p) const;
  TunedParameters Denormalise(const std::vector<double>& x) const;
  void ChooseNext();
  void Finish();
  void WriteRow(const std::string& label, const Sample& sample);

  bool tune_fusion_;
  bool tune_cycle_;
  bool tune_cache_;
  int warmup_left_;
  int steps_per_sample_;
  int max_samples_;
  TunedParameters current_;
  std::unique_ptr<BayesianOptimizer> optimizer_;  // null when neither variable is free
  std::vector<std::vector<double>> initial_design_;
  int bayes_samples_ = 0;  // samples scored for the optimiser (the cache trial is not one)
  bool cache_trial_done_ = false;
  std::vector<Sample> samples_;
  size_t best_index_ = 0;
  std::ofstream log_;

  // The sample being measured.
  bool waiting_for_round_ = true;
  Clock::time_point sample_start_;
  int64_t sample_bytes_ = 0;
  int64_t step_bytes_ = 0;
  int steps_ = 0;
  std::unordered_set<std::string> step_names_;
};

}  // namespace horovodlike
