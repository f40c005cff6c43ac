#include "parameter_manager.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iomanip>

#include "../common/common.h"
#include "../common/logging.h"

namespace horovodlike {
namespace {

double Clamp01(double v) { return std::min(1.0, std::max(0.0, v)); }

double ToUnit(double value, double low, double high) {
  value = std::min(high, std::max(low, value));
  return Clamp01(std::log(value / low) / std::log(high / low));
}

double FromUnit(double x, double low, double high) {
  return low * std::exp(Clamp01(x) * std::log(high / low));
}

// Space-filling points tried after the configured one and before the model guides the search,
// so that it starts from a spread of the space rather than one corner of it.
std::vector<std::vector<double>> InitialDesign(int dims) {
  if (dims == 1) return {{0.25}, {0.75}};
  if (dims == 2) return {{0.25, 0.25}, {0.75, 0.75}, {0.25, 0.75}, {0.75, 0.25}};
  return {};
}

std::string Describe(const TunedParameters& p) {
  std::ostringstream out;
  out << "cycle time " << p.cycle_time_ms << " ms, fusion threshold " << p.fusion_threshold_bytes
      << " bytes, response cache " << (p.cache_enabled ? "on" : "off");
  return out.str();
}

}  // namespace

ParameterManager::ParameterManager(const Config& config, TunedParameters initial)
    : tune_fusion_(!config.fusion_threshold_given),
      tune_cycle_(!config.cycle_time_given),
      tune_cache_(!config.cache_capacity_given && config.cache_capacity > 0 &&
                  initial.cache_enabled),
      warmup_left_(config.autotune_warmup_samples),
      steps_per_sample_(config.autotune_steps_per_sample),
      max_samples_(config.autotune_max_samples),
      current_(initial) {
  const int dims = (tune_fusion_ ? 1 : 0) + (tune_cycle_ ? 1 : 0);
  if (dims > 0) {
    optimizer_ = std::make_unique<BayesianOptimizer>(dims, config.autotune_noise);
    initial_design_ = InitialDesign(dims);
  }
  current_.tuning = dims > 0 || tune_cache_;
  if (!config.autotune_log.empty()) {
    log_.open(config.autotune_log, std::ios::out | std::ios::trunc);
    if (!log_.good()) {
      throw InvalidArgument("HOROVOD_AUTOTUNE_LOG=" + config.autotune_log +
                            ": cannot open the file for writing (" + std::strerror(errno) + ")");
    }
    // Horovod's columns for the knobs this runtime has, with the sample number first; the
    // threshold is in bytes, as HOROVOD_FUSION_THRESHOLD, the score in bytes per second.
    log_ << "sample,cache_enabled,cycle_time_ms,tensor_fusion_threshold,score" << std::endl;
  }
  if (!current_.tuning) {
    HVDL_LOG(kWarning, "HOROVOD_AUTOTUNE is set, but HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME "
                       "and HOROVOD_CACHE_CAPACITY are all set explicitly, which holds them "
                       "constant: there is nothing left to tune");
    return;
  }
  HVDL_LOG(kInfo, "autotune: tuning"
                      << (tune_fusion_ ? " the fusion threshold" : "")
                      << (tune_cycle_ ? " the cycle time" : "")
                      << (tune_cache_ ? " the response cache" : "") << ", starting from "
                      << Describe(current_));
}

std::vector<double> ParameterManager::Normalise(const TunedParameters& p) const {
  std::vector<double> x;
  if (tune_fusion_) {
    x.push_back(ToUnit(static_cast<double>(p.fusion_threshold_bytes), kMinFusionBytes,
                       kMaxFusionBytes));
  }
  if (tune_cycle_) x.push_back(ToUnit(p.cycle_time_ms, kMinCycleMs, kMaxCycleMs));
  return x;
}

TunedParameters ParameterManager::Denormalise(const std::vector<double>& x) const {
  TunedParameters p = current_;
  size_t i = 0;
  if (tune_fusion_) {
    p.fusion_threshold_bytes =
        std::llround(FromUnit(x.at(i++), kMinFusionBytes, kMaxFusionBytes));
  }
  if (tune_cycle_) {
    // Hundredths of a millisecond: finer is noise, and the value prints back exactly.
    p.cycle_time_ms = std::round(FromUnit(x.at(i++), kMinCycleMs, kMaxCycleMs) * 100) / 100;
  }
  return p;
}

void ParameterManager::RoundStarted(Clock::time_point now) {
  if (!waiting_for_round_ || !current_.tuning) return;
  waiting_for_round_ = false;
  sample_start_ = now;
  sample_bytes_ = 0;
  step_bytes_ = 0;
  steps_ = 0;
  step_names_.clear();
}

void ParameterManager::ObserveAllreduce(int set_id, const Response* const* parts, size_t count,
                                        Clock::time_point now) {
  if (waiting_for_round_ || !current_.tuning) return;
  // Names are only unique within a process set.
  const std::string prefix = std::to_string(set_id) + ":";
  bool repeated = false;
  int64_t bytes = 0;
  for (size_t i = 0; i < count; ++i) {
    repeated = repeated || step_names_.count(prefix + parts[i]->names.at(0));
    bytes += parts[i]->total_bytes;
  }
  if (repeated) {
    sample_bytes_ += step_bytes_;
    step_bytes_ = 0;
    step_names_.clear();
    if (++steps_ == steps_per_sample_) {
      const double seconds = std::chrono::duration<double>(now - sample_start_).count();
      RecordScore(seconds > 0 ? static_cast<double>(sample_bytes_) / seconds : 0.0);
      return;  // this allreduce ran before the next parameters: it belongs to no sample
    }
  }
  for (size_t i = 0; i < count; ++i) step_names_.insert(prefix + parts[i]->names.at(0));
  step_bytes_ += bytes;
}

void ParameterManager::RecordScore(double score) {
  if (!current_.tuning) return;
  waiting_for_round_ = true;
  if (warmup_left_ > 0) {
    --warmup_left_;
    HVDL_LOG(kInfo, "autotune: warm-up sample discarded (" << warmup_left_ << " left), score "
                                                            << score << " bytes/s");
    return;
  }
  samples_.push_back({current_, score});
  if (score > samples_[best_index_].score) best_index_ = samples_.size() - 1;
  WriteRow(std::to_string(samples_.size()), samples_.back());
  HVDL_LOG(kInfo, "autotune: sample " << samples_.size() << ": " << Describe(current_)
                                      << ": " << score << " bytes/s");
  if (!cache_trial_done_ && optimizer_) {
    optimizer_->AddSample(Normalise(current_), score);
  }
  ChooseNext();
}

void ParameterManager::ChooseNext() {
  const int budget = optimizer_ ? max_samples_ : 1;  // without free variables: a baseline only
  const int scored = static_cast<int>(samples_.size());
  if (!cache_trial_done_ && scored < budget) {
    // The first sample was the configured point; then the initial design; then the model.
    const size_t design = static_cast<size_t>(scored - 1);
    current_ = Denormalise(design < initial_design_.size() ? initial_design_[design]
                                                           : optimizer_->NextSample());
    return;
  }
  if (tune_cache_ && !cache_trial_done_) {
    // The cache is a yes/no choice, not a dimension for the model: one sample of the best
    // point so far without it tells whether it pays.
    cache_trial_done_ = true;
    current_ = best().parameters;
    current_.cache_enabled = false;
    return;
  }
  Finish();
}

void ParameterManager::Finish() {
  current_ = best().parameters;
  current_.tuning = false;
  WriteRow("best", best());
  HVDL_LOG(kInfo, "autotune: done after " << samples_.size() << " samples; keeping "
                                          << Describe(current_) << " (" << best().score
                                          << " bytes/s)");
}

void ParameterManager::WriteRow(const std::string& label, const Sample& sample) {
  if (!log_.is_open()) return;
  const TunedParameters& p = sample.parameters;
  log_ << label << ',' << (p.cache_enabled ? 1 : 0) << ',' << p.cycle_time_ms << ','
       << p.fusion_threshold_bytes << ',' << std::setprecision(10) << sample.score
       << std::setprecision(6) << std::endl;
}

}  // namespace horovodlike
