// Bayesian optimisation over a few continuous variables, each normalised to [0, 1]: a Gaussian
// process with a squared-exponential (RBF) kernel models the score, and the next point to try
// is the one of largest expected improvement over the best score seen.
//
// Small by design: the autotuner takes tens of samples in two dimensions, so a dense grid of
// candidates refined by a pattern search finds the acquisition maximum well enough, and the
// whole procedure is deterministic (no random numbers), so a run can be reproduced and tested.
#pragma once

#include <cstddef>
#include <vector>

namespace horovodlike {

class BayesianOptimizer {
 public:
  // `noise`: variance added to the kernel's diagonal, relative to the variance of the scores
  // (which are standardised), to account for measurements that vary from run to run.
  BayesianOptimizer(int dims, double noise);

  void AddSample(const std::vector<double>& x, double score);
  // The point of largest expected improvement; the centre of the space before any sample.
  std::vector<double> NextSample() const;

  size_t num_samples() const { return scores_.size(); }
  int dims() const { return dims_; }

 private:
  // Refits the model: standardises the scores, picks the length scale of largest marginal
  // likelihood, factorises the kernel matrix.
  void Fit();
  double Kernel(const std::vector<double>& a, const std::vector<double>& b) const;
  // Posterior of the standardised score at x.
  void Posterior(const std::vector<double>& x, double* mean, double* variance) const;
  double ExpectedImprovement(const std::vector<double>& x, double best) const;

  int dims_;
  double noise_;
  std::vector<std::vector<double>> points_;
  std::vector<double> scores_;
  // The fitted model.
  double score_mean_ = 0, score_scale_ = 1;
  double length_scale_ = 0.3;
  std::vector<double> cholesky_;  // lower triangle of K + noise I, row-major n x n
  std::vector<double> alpha_;     // (K + noise I)^-1 y
};

}  // namespace horovodlike
