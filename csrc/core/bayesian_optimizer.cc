#include "bayesian_optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace horovodlike {
namespace {

// Length scales tried when fitting, in normalised units. The first wins ties, so with too few
// samples to tell them apart the model keeps a moderate one.
constexpr double kLengthScales[] = {0.3, 0.1, 0.15, 0.2, 0.5, 0.8};
// Keeps the kernel matrix positive definite when the noise is 0 or samples coincide.
constexpr double kJitter = 1e-6;
// How much better than the best seen a point must promise to be: a little exploration.
constexpr double kExplorationMargin = 0.01;

// In-place Cholesky factorisation of a symmetric positive definite n x n matrix (row-major)
// into its lower triangle; false when it is not positive definite.
bool Cholesky(std::vector<double>& a, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    double d = a[j * n + j];
    for (size_t k = 0; k < j; ++k) d -= a[j * n + k] * a[j * n + k];
    if (!(d > 0)) return false;
    d = std::sqrt(d);
    a[j * n + j] = d;
    for (size_t i = j + 1; i < n; ++i) {
      double s = a[i * n + j];
      for (size_t k = 0; k < j; ++k) s -= a[i * n + k] * a[j * n + k];
      a[i * n + j] = s / d;
    }
    for (size_t k = j + 1; k < n; ++k) a[j * n + k] = 0;
  }
  return true;
}

// Solves L x = b in place (L lower triangular).
void ForwardSubstitute(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t i = 0; i < n; ++i) {
    double s = b[i];
    for (size_t k = 0; k < i; ++k) s -= l[i * n + k] * b[k];
    b[i] = s / l[i * n + i];
  }
}

// Solves L^T x = b in place.
void BackSubstitute(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t i = n; i-- > 0;) {
    double s = b[i];
    for (size_t k = i + 1; k < n; ++k) s -= l[k * n + i] * b[k];
    b[i] = s / l[i * n + i];
  }
}

double NormalPdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI); }
double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

}  // namespace

BayesianOptimizer::BayesianOptimizer(int dims, double noise) : dims_(dims), noise_(noise) {
  if (dims < 1) throw std::invalid_argument("BayesianOptimizer needs at least one dimension");
  if (!(noise >= 0)) throw std::invalid_argument("BayesianOptimizer noise must be >= 0");
}

double BayesianOptimizer::Kernel(const std::vector<double>& a,
                                 const std::vector<double>& b) const {
  double d2 = 0;
  for (int i = 0; i < dims_; ++i) d2 += (a[i] - b[i]) * (a[i] - b[i]);
  return std::exp(-d2 / (2 * length_scale_ * length_scale_));
}

void BayesianOptimizer::AddSample(const std::vector<double>& x, double score) {
  if (static_cast<int>(x.size()) != dims_) {
    throw std::invalid_argument("BayesianOptimizer sample has the wrong number of dimensions");
  }
  std::vector<double> clamped(x);
  for (double& v : clamped) v = std::min(1.0, std::max(0.0, v));
  points_.push_back(std::move(clamped));
  scores_.push_back(score);
  Fit();
}

void BayesianOptimizer::Fit() {
  const size_t n = scores_.size();
  double mean = 0;
  for (double s : scores_) mean += s;
  mean /= n;
  double var = 0;
  for (double s : scores_) var += (s - mean) * (s - mean);
  var /= n;
  score_mean_ = mean;
  // Scores are bytes per second, of any magnitude: standardising lets the kernel's unit
  // variance and the noise setting mean the same whatever the job's bandwidth.
  score_scale_ = var > 0 ? std::sqrt(var) : (std::abs(mean) > 0 ? std::abs(mean) : 1.0);
  std::vector<double> y(n);
  for (size_t i = 0; i < n; ++i) y[i] = (scores_[i] - score_mean_) / score_scale_;

  double best_likelihood = -INFINITY;
  std::vector<double> best_cholesky, best_alpha;
  double best_length = kLengthScales[0];
  for (double length : kLengthScales) {
    length_scale_ = length;
    std::vector<double> k(n * n);
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) k[i * n + j] = Kernel(points_[i], points_[j]);
      k[i * n + i] += noise_ + kJitter;
    }
    if (!Cholesky(k, n)) continue;
    std::vector<double> alpha(y);
    ForwardSubstitute(k, n, alpha);
    double fit = 0;
    for (double a : alpha) fit += a * a;  // y^T K^-1 y, as |L^-1 y|^2
    BackSubstitute(k, n, alpha);
    double log_det = 0;
    for (size_t i = 0; i < n; ++i) log_det += std::log(k[i * n + i]);
    const double likelihood = -0.5 * fit - log_det;
    if (likelihood > best_likelihood) {
      best_likelihood = likelihood;
      best_cholesky = std::move(k);
      best_alpha = std::move(alpha);
      best_length = length;
    }
  }
  if (best_cholesky.empty()) {
    throw std::runtime_error("BayesianOptimizer: kernel matrix is not positive definite");
  }
  length_scale_ = best_length;
  cholesky_ = std::move(best_cholesky);
  alpha_ = std::move(best_alpha);
}

void BayesianOptimizer::Posterior(const std::vector<double>& x, double* mean,
                                  double* variance) const {
  const size_t n = scores_.size();
  std::vector<double> k(n);
  double m = 0;
  for (size_t i = 0; i < n; ++i) {
    k[i] = Kernel(points_[i], x);
    m += k[i] * alpha_[i];
  }
  ForwardSubstitute(cholesky_, n, k);
  double explained = 0;
  for (double v : k) explained += v * v;
  *mean = m;
  *variance = std::max(1.0 - explained, 1e-12);
}

double BayesianOptimizer::ExpectedImprovement(const std::vector<double>& x, double best) const {
  double mean, variance;
  Posterior(x, &mean, &variance);
  const double sigma = std::sqrt(variance);
  const double gain = mean - best - kExplorationMargin;
  const double z = gain / sigma;
  return gain * NormalCdf(z) + sigma * NormalPdf(z);
}

std::vector<double> BayesianOptimizer::NextSample() const {
  if (scores_.empty()) return std::vector<double>(dims_, 0.5);
  double best = -INFINITY;
  for (double s : scores_) best = std::max(best, (s - score_mean_) / score_scale_);

  // A grid over the cube (finer in fewer dimensions)...
  const int per_dim = dims_ == 1 ? 101 : dims_ == 2 ? 33 : 9;
  size_t total = 1;
  for (int d = 0; d < dims_; ++d) total *= per_dim;
  std::vector<double> x(dims_), best_x(dims_, 0.5);
  double best_ei = -INFINITY;
  for (size_t index = 0; index < total; ++index) {
    size_t rest = index;
    for (int d = 0; d < dims_; ++d) {
      x[d] = static_cast<double>(rest % per_dim) / (per_dim - 1);
      rest /= per_dim;
    }
    const double ei = ExpectedImprovement(x, best);
    if (ei > best_ei) {
      best_ei = ei;
      best_x = x;
    }
  }
  // ...then a pattern search from its best point, halving the step when no move helps.
  double step = 1.0 / (per_dim - 1);
  for (int iteration = 0; iteration < 40 && step > 1e-4; ++iteration) {
    bool moved = false;
    for (int d = 0; d < dims_ && !moved; ++d) {
      for (double direction : {-1.0, 1.0}) {
        x = best_x;
        x[d] = std::min(1.0, std::max(0.0, x[d] + direction * step));
        const double ei = ExpectedImprovement(x, best);
        if (ei > best_ei) {
          best_ei = ei;
          best_x = x;
          moved = true;
          break;
        }
      }
    }
    if (!moved) step /= 2;
  }
  return best_x;
}

}  // namespace horovodlike
