// A synthetic barrel tracking detector for the GNN example: charged particles from the beam line
// bend on helices in a solenoid field, leave smeared hits where they cross N cylindrical
// layers, noise hits are added, and each event becomes a graph whose candidate edges join hits
// on adjacent layers that a particle above the pT threshold could have joined (a phi-slope and
// a z0 window, as the HEP.TrkX / L2IT graph construction does). Edge label 1 when both hits
// belong to the same particle. Everything is deterministic from (seed, event index).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dltrain/data/graph.hpp"

namespace gnn_tracking {

struct DetectorConfig {
  int layers = 8;               ///< barrel layers, radii geometric between r_min and r_max
  double r_min = 30;            ///< mm
  double r_max = 1000;          ///< mm
  double half_length = 2500;    ///< mm: |z| beyond leaves no hit
  double b_field = 2.0;         ///< T, along z
  int particles = 200;          ///< charged particles per event
  double pt_min = 0.5;          ///< GeV, log-uniform up to pt_max
  double pt_max = 10.0;         ///< GeV
  double eta_max = 1.5;         ///< |eta| uniform below
  double z0_sigma = 30;         ///< mm: Gaussian spread of the vertex along z
  double sigma_rphi = 0.1;      ///< mm: hit resolution across the layer
  double sigma_z = 0.5;         ///< mm: hit resolution along z
  double noise_fraction = 0.2;  ///< noise hits per layer = fraction x particles
  double z0_max = 150;          ///< mm: edge window on the segment's extrapolated z at r = 0

  /// Layer radii in mm.
  std::vector<double> radii() const;
  /// One line: "8 layers r 30..1000 mm, B 2 T, 50 particles pT 1..10 GeV, |eta| < 1.5, ...".
  std::string describe() const;
};

/// Figures of the generated events (summed over events by the caller).
struct EventStats {
  int64_t hits = 0, noise_hits = 0, edges = 0, true_edges = 0;
  /// True segments between adjacent layers, in the candidate graph or not (the graph
  /// construction's efficiency is true_edges / true_segments).
  int64_t true_segments = 0;
  EventStats& operator+=(const EventStats& o);
};

/// One event as a graph: x [N, 3] f32 (r / r_max, phi / pi, z / half_length), edge_index int64
/// [2, E] (inner layer -> outer layer), edge_attr [E, 4] f32 (dr, dphi, dz, z0, scaled), y [E]
/// f32 in {0, 1}.
dltrain::data::Graph generate_event(const DetectorConfig& cfg, uint64_t seed, int64_t index,
                                    EventStats* stats = nullptr);

/// Events [first, first + count) of a seed.
std::vector<dltrain::data::Graph> generate_events(const DetectorConfig& cfg, uint64_t seed,
                                                  int64_t first, int64_t count,
                                                  EventStats* stats = nullptr);

/// Writes graphs to a safetensors file ("event_<i>.x", ".edge_index", ".edge_attr", ".y", and
/// metadata "events" and "detector") for benchmarks/peers/pytorch_gnn_tracking.py.
void dump_events(const std::string& path, const std::vector<dltrain::data::Graph>& graphs,
                 const DetectorConfig& cfg);

}  // namespace gnn_tracking
