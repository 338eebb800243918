// ZipfDistribution: draws k in [1, n] with P(k) proportional to 1 / k^exponent.
//
// Rejection-inversion sampling (Hörmann & Derflinger 1996): O(1) per draw and O(1) memory for
// any n, so it serves 10M-row benchmarks and the synthetic data source alike.
//
//   hyrec::ZipfDistribution zipf(10'000'000, 1.05);
//   std::mt19937_64 rng(/*seed=*/7);
//   uint64_t rank = zipf(rng);  // 1 is the most frequent
#ifndef HYREC_COMMON_ZIPF_H_
#define HYREC_COMMON_ZIPF_H_

#include <cmath>
#include <cstdint>

namespace hyrec {

class ZipfDistribution {
 public:
  // Requires n >= 1 and exponent > 0.
  ZipfDistribution(uint64_t n, double exponent)
      : n_(n),
        exponent_(exponent),
        h_integral_x1_(HIntegral(1.5) - 1.0),
        h_integral_n_(HIntegral(static_cast<double>(n) + 0.5)),
        s_(2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0))) {}

  template <typename Rng>
  uint64_t operator()(Rng& rng) const {
    for (;;) {
      const double uniform = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      const double u = h_integral_n_ + uniform * (h_integral_x1_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      double k = std::floor(x + 0.5);
      if (k < 1) k = 1;
      if (k > static_cast<double>(n_)) k = static_cast<double>(n_);
      if (k - x <= s_ || u >= HIntegral(k + 0.5) - H(k)) return static_cast<uint64_t>(k);
    }
  }

  uint64_t n() const { return n_; }
  double exponent() const { return exponent_; }

 private:
  double H(double x) const { return std::exp(-exponent_ * std::log(x)); }
  double HIntegral(double x) const {
    const double log_x = std::log(x);
    return Helper2((1.0 - exponent_) * log_x) * log_x;
  }
  double HIntegralInverse(double x) const {
    double t = x * (1.0 - exponent_);
    if (t < -1.0) t = -1.0;
    return std::exp(Helper1(t) * x);
  }
  // log1p(x) / x and expm1(x) / x, accurate near 0.
  static double Helper1(double x) {
    return std::fabs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
  }
  static double Helper2(double x) {
    return std::fabs(x) > 1e-8 ? std::expm1(x) / x : 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
  }

  uint64_t n_;
  double exponent_;
  double h_integral_x1_;
  double h_integral_n_;
  double s_;
};

}  // namespace hyrec

#endif  // HYREC_COMMON_ZIPF_H_
