// The synthetic detector of detector.hpp.
//
// Helix: a particle of transverse momentum pT (GeV) and charge q in a field B (T) along z
// circles in the transverse plane with radius R = pT / (0.3 B) m. Starting at the origin with
// direction phi0, it crosses the cylinder of radius r < 2R at azimuth phi0 - q asin(r / 2R),
// after a transverse arc length s = 2R asin(r / 2R), at z = z0 + s sinh(eta). Hits are smeared
// by Gaussians in r-phi and z; noise hits are uniform in phi and z.
//
// Candidate edges join hit i on layer l and hit j on layer l + 1 when |dphi| is within the
// largest bend a particle at pt_min can make between the two radii (plus four times the
// smearing) and the segment extrapolates to |z| < z0_max at r = 0. The random numbers come from
// std::mt19937_64 through our own uniform and Box-Muller transforms (the std distributions are
// implementation-defined), so an event is the same with every standard library.
#include "examples/gnn_tracking/detector.hpp"

#include <cmath>
#include <cstdio>
#include <numbers>
#include <random>

#include "dltrain/io/safetensors.hpp"

namespace gnn_tracking {

using namespace dltrain;

namespace {

constexpr double kPi = std::numbers::pi;

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  double uniform() { return static_cast<double>(g_() >> 11) * 0x1p-53; }
  double uniform(double a, double b) { return a + (b - a) * uniform(); }
  double normal() {
    const double u = 1.0 - uniform(), v = uniform();  // u in (0, 1]
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * kPi * v);
  }

 private:
  std::mt19937_64 g_;
};

// splitmix64 of (seed, index): independent streams per event.
uint64_t mix(uint64_t seed, int64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index) + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double wrap(double phi) {
  while (phi > kPi) phi -= 2 * kPi;
  while (phi <= -kPi) phi += 2 * kPi;
  return phi;
}

struct Hit {
  double r, phi, z;
  int64_t particle;  // -1: noise
};

}  // namespace

std::vector<double> DetectorConfig::radii() const {
  std::vector<double> r(static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l)
    r[static_cast<size_t>(l)] =
        layers == 1 ? r_min : r_min * std::pow(r_max / r_min, double(l) / (layers - 1));
  return r;
}

std::string DetectorConfig::describe() const {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%d layers r %.0f..%.0f mm, B %.1f T, %d particles pT %.1f..%.1f GeV, |eta| < "
                "%.1f, z0 sigma %.0f mm, noise %.0f%%, resolution %.2f mm (r-phi) %.2f mm (z)",
                layers, r_min, r_max, b_field, particles, pt_min, pt_max, eta_max, z0_sigma,
                100 * noise_fraction, sigma_rphi, sigma_z);
  return buf;
}

EventStats& EventStats::operator+=(const EventStats& o) {
  hits += o.hits;
  noise_hits += o.noise_hits;
  edges += o.edges;
  true_edges += o.true_edges;
  true_segments += o.true_segments;
  return *this;
}

data::Graph generate_event(const DetectorConfig& cfg, uint64_t seed, int64_t index,
                           EventStats* stats) {
  Rng rng(mix(seed, index));
  const std::vector<double> radii = cfg.radii();
  const size_t L = radii.size();
  std::vector<std::vector<Hit>> layers(L);
  EventStats st;
  for (int p = 0; p < cfg.particles; ++p) {
    const double pt = cfg.pt_min * std::pow(cfg.pt_max / cfg.pt_min, rng.uniform());
    const double phi0 = rng.uniform(-kPi, kPi);
    const double eta = rng.uniform(-cfg.eta_max, cfg.eta_max);
    const double q = rng.uniform() < 0.5 ? -1.0 : 1.0;
    const double z0 = cfg.z0_sigma * rng.normal();
    const double R = 1000.0 * pt / (0.3 * cfg.b_field);  // mm
    for (size_t l = 0; l < L; ++l) {
      const double r = radii[l];
      if (r >= 2 * R) break;  // curls up before this layer
      const double a = std::asin(r / (2 * R));
      const double z = z0 + 2 * R * a * std::sinh(eta) + cfg.sigma_z * rng.normal();
      const double phi = wrap(phi0 - q * a + cfg.sigma_rphi / r * rng.normal());
      if (std::abs(z) > cfg.half_length) break;
      layers[l].push_back({r, phi, z, p});
      if (l > 0) ++st.true_segments;  // hits on consecutive layers until it leaves
    }
  }
  const int noise = static_cast<int>(std::lround(cfg.noise_fraction * cfg.particles));
  for (size_t l = 0; l < L; ++l)
    for (int k = 0; k < noise; ++k) {
      layers[l].push_back(
          {radii[l], rng.uniform(-kPi, kPi), rng.uniform(-cfg.half_length, cfg.half_length), -1});
      ++st.noise_hits;
    }

  // Node ids: layer by layer.
  std::vector<int64_t> first(L + 1, 0);
  for (size_t l = 0; l < L; ++l) first[l + 1] = first[l] + static_cast<int64_t>(layers[l].size());
  const int64_t n = first[L];
  std::vector<float> x(static_cast<size_t>(3 * n));
  for (size_t l = 0; l < L; ++l)
    for (size_t i = 0; i < layers[l].size(); ++i) {
      const Hit& h = layers[l][i];
      float* row = &x[static_cast<size_t>(3 * (first[l] + static_cast<int64_t>(i)))];
      row[0] = static_cast<float>(h.r / cfg.r_max);
      row[1] = static_cast<float>(h.phi / kPi);
      row[2] = static_cast<float>(h.z / cfg.half_length);
    }

  std::vector<int64_t> src, dst;
  std::vector<float> attr, y;
  const double r_min_bend = 1000.0 * cfg.pt_min / (0.3 * cfg.b_field);
  for (size_t l = 0; l + 1 < L; ++l) {
    const double r1 = radii[l], r2 = radii[l + 1], dr = r2 - r1;
    const double bend = std::asin(std::min(1.0, r2 / (2 * r_min_bend))) -
                        std::asin(std::min(1.0, r1 / (2 * r_min_bend)));
    const double smear = 4 * std::hypot(cfg.sigma_rphi / r1, cfg.sigma_rphi / r2);
    const double dphi_max = bend + smear;
    for (size_t i = 0; i < layers[l].size(); ++i)
      for (size_t j = 0; j < layers[l + 1].size(); ++j) {
        const Hit &a = layers[l][i], &b = layers[l + 1][j];
        const double dphi = wrap(b.phi - a.phi);
        if (std::abs(dphi) > dphi_max) continue;
        const double dz = b.z - a.z;
        const double z0 = a.z - a.r * dz / dr;
        if (std::abs(z0) > cfg.z0_max) continue;
        src.push_back(first[l] + static_cast<int64_t>(i));
        dst.push_back(first[l + 1] + static_cast<int64_t>(j));
        attr.insert(
            attr.end(),
            {static_cast<float>(dr / cfg.r_max), static_cast<float>(dphi / dphi_max),
             static_cast<float>(dz / cfg.half_length), static_cast<float>(z0 / cfg.z0_max)});
        const bool same = a.particle >= 0 && a.particle == b.particle;
        y.push_back(same ? 1.0f : 0.0f);
        st.true_edges += same;
      }
  }
  const int64_t e = static_cast<int64_t>(src.size());
  st.hits = n;
  st.edges = e;
  if (stats) *stats += st;
  std::vector<int64_t> ei(src);
  ei.insert(ei.end(), dst.begin(), dst.end());
  data::Graph g;
  g.x = from_vector(x, {n, 3});
  g.edge_index = from_vector(ei, {2, e});
  g.edge_attr = from_vector(attr, {e, 4});
  g.y = from_vector(y, {e});
  return g;
}

std::vector<data::Graph> generate_events(const DetectorConfig& cfg, uint64_t seed, int64_t first,
                                         int64_t count, EventStats* stats) {
  std::vector<data::Graph> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = first; i < first + count; ++i)
    out.push_back(generate_event(cfg, seed, i, stats));
  return out;
}

void dump_events(const std::string& path, const std::vector<data::Graph>& graphs,
                 const DetectorConfig& cfg) {
  StateDict sd;
  for (size_t i = 0; i < graphs.size(); ++i) {
    const std::string p = "event_" + std::to_string(i) + ".";
    sd.insert(p + "x", graphs[i].x);
    sd.insert(p + "edge_index", graphs[i].edge_index);
    sd.insert(p + "edge_attr", graphs[i].edge_attr);
    sd.insert(p + "y", graphs[i].y);
  }
  io::save_safetensors(path, sd,
                       {{"events", std::to_string(graphs.size())}, {"detector", cfg.describe()}});
}

}  // namespace gnn_tracking
