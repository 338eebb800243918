#include "hyrec/common/metrics.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace hyrec {
namespace {

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kSummary:
      return "summary";
    case MetricType::kGauge:
      break;
  }
  return "gauge";
}

// Label values escape backslash, double quote and newline; help text backslash and newline.
std::string Escape(absl::string_view text, bool quotes) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.17g", v);
  return buffer;
}

}  // namespace

bool MetricsRegistry::ValidName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = absl::ascii_isalpha(c) || c == '_' || c == ':' || (i > 0 && absl::ascii_isdigit(c));
    if (!ok) return false;
  }
  return true;
}

void MetricsRegistry::Describe(const std::string& name, MetricType type, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = families_[name];
  f.type = type;
  f.described = true;
  f.help = help;
}

void MetricsRegistry::Set(const std::string& name, const MetricLabels& labels, double value) {
  std::lock_guard<std::mutex> lock(mu_);
  families_[name].samples[labels] = value;
}

void MetricsRegistry::Add(const std::string& name, const MetricLabels& labels, double delta) {
  std::lock_guard<std::mutex> lock(mu_);
  families_[name].samples[labels] += delta;
}

void MetricsRegistry::SetSummary(const std::string& name, const MetricLabels& labels, double sum, double count) {
  MetricLabels with_sum = labels, with_count = labels;
  with_sum.emplace_back("__suffix", "_sum");
  with_count.emplace_back("__suffix", "_count");
  std::lock_guard<std::mutex> lock(mu_);
  families_[name].samples[with_sum] = sum;
  families_[name].samples[with_count] = count;
}

double MetricsRegistry::Get(const std::string& name, const MetricLabels& labels, double missing) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto f = families_.find(name);
  if (f == families_.end()) return missing;
  auto s = f->second.samples.find(labels);
  return s == f->second.samples.end() ? missing : s->second;
}

void MetricsRegistry::AddCollector(std::function<void(MetricsRegistry*)> collect) {
  std::lock_guard<std::mutex> lock(collectors_mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsRegistry::Render() {
  {
    std::lock_guard<std::mutex> collecting(collectors_mu_);
    for (const auto& collect : collectors_) collect(this);
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    if (!ValidName(name) || family.samples.empty()) continue;
    if (family.described) {
      absl::StrAppend(&out, "# HELP ", name, " ", Escape(family.help, false), "\n");
      absl::StrAppend(&out, "# TYPE ", name, " ", TypeName(family.type), "\n");
    }
    for (const auto& [labels, value] : family.samples) {
      // A summary's samples are named <name>_sum and <name>_count: they carry a "__suffix" label.
      std::string sample_name = name;
      std::string rendered;
      for (const auto& [key, label_value] : labels) {
        if (key == "__suffix") {
          sample_name += label_value;
          continue;
        }
        if (!ValidName(key)) continue;
        absl::StrAppend(&rendered, rendered.empty() ? "" : ",", key, "=\"", Escape(label_value, true), "\"");
      }
      absl::StrAppend(&out, sample_name, rendered.empty() ? "" : "{", rendered, rendered.empty() ? "" : "}", " ",
                      FormatValue(value), "\n");
    }
  }
  return out;
}

}  // namespace hyrec
