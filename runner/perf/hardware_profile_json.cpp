// The hardware profile's JSON file (hardware_profile.h: to_json, from_json): what `runner
// calibrate` writes and hardware.profile names. Its own file so that the reader, which takes
// untrusted bytes, links alone into the fuzz target (tests/fuzz/fuzz_hardware_profile.cpp).
// Every figure is checked against the range a machine can have, so the cost model's arithmetic
// never sees a negative, infinite or vanishing rate, latency or count.
#include <cmath>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "runner/errors.h"
#include "runner/perf/hardware_profile.h"

namespace runner {

namespace {

constexpr const char* kFormat = "runner-hardware-profile";
constexpr int kVersion = 1;
const std::string kCalibrateFix = "run `runner calibrate --out FILE` on the machine and name FILE in hardware.profile "
                                  "(or plan --profile FILE); or remove hardware.profile to use the built-in profile";

}  // namespace

std::string to_string(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::all_gather: return "all_gather";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::send_recv: return "send_recv";
    case Collective::broadcast: return "broadcast";
  }
  return "?";
}

namespace {

nlohmann::json link_json(const Link& l) { return {{"latency_s", l.latency_s}, {"bandwidth", l.bandwidth}}; }

nlohmann::json compute_json(const ComputeProfile& c) {
  nlohmann::json g = nlohmann::json::object(), a = nlohmann::json::object();
  for (const auto& [dtype, rs] : c.gemm) {
    g[dtype] = nlohmann::json::array();
    for (const GemmRate& r : rs) g[dtype].push_back({r.m, r.n, r.k, r.flops_per_s});
  }
  for (const auto& [dtype, rs] : c.attention) {
    a[dtype] = nlohmann::json::array();
    for (const AttentionRate& r : rs)
      a[dtype].push_back({r.seq, r.head_dim, r.forward_flops_per_s, r.backward_flops_per_s});
  }
  return {{"threads", c.threads},       {"memory_bandwidth", c.memory_bandwidth}, {"launch_s", c.launch_s},
          {"op_bandwidth", c.op_bandwidth}, {"gemm", g}, {"attention", a}};
}

Collective collective_of(const std::string& s) {
  for (Collective c : {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
                       Collective::send_recv, Collective::broadcast})
    if (to_string(c) == s) return c;
  throw std::invalid_argument("unknown collective \"" + s + "\"");
}

// Throws std::invalid_argument naming what is wrong; from_json turns it into a UserError.
void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

// The ranges a measured figure can take. Outside them the cost model's arithmetic gives
// negative, infinite or NaN step times (a rate of 1e-300 flop/s, a launch of -1 s), and the
// layout search would rank layouts by them; so a value outside is refused, named, at load.
constexpr double kMinRate = 1e3, kMaxRate = 1e20;        // flop/s
constexpr double kMinBandwidth = 1e3, kMaxBandwidth = 1e16;  // bytes/s
constexpr double kMaxLatency = 60;                        // s: a launch or a link's latency
constexpr int64_t kMaxCount = 1 << 20;                    // threads, cores, nodes, devices per node

void in_range(double v, double lo, double hi, const std::string& key, const char* unit) {
  require(std::isfinite(v) && v >= lo && v <= hi,
          fmt::format("{} is {:g}: it must be a finite number in [{:g}, {:g}] {}", key, v, lo, hi, unit));
}
void count_in_range(int64_t v, int64_t lo, const std::string& key) {
  require(v >= lo && v <= kMaxCount, fmt::format("{} is {}: it must be an integer in [{}, {}]", key, v, lo, kMaxCount));
}
// An integer of the file (a count or a shape), read only when it is one: a real such as 1e300
// has no integer value to convert to.
int64_t integer(const nlohmann::json& v, const std::string& key) {
  require(v.is_number_integer(), fmt::format("{} is {}: it must be an integer", key, v.dump()));
  return v.get<int64_t>();
}
int64_t count(const nlohmann::json& v, int64_t lo, const std::string& key) {
  const int64_t n = integer(v, key);
  count_in_range(n, lo, key);
  return n;
}
int64_t count_or(const nlohmann::json& j, const char* key, int64_t fallback, int64_t lo) {
  return j.contains(key) ? count(j.at(key), lo, key) : fallback;
}

ComputeProfile compute_of(const nlohmann::json& j, size_t index, bool cpu) {
  ComputeProfile c;
  const std::string at = fmt::format("compute[{}].", index);
  // A GPU's entry has no thread count (0); a CPU's names the threads it was measured with.
  c.threads = static_cast<int>(count(j.at("threads"), cpu ? 1 : 0, at + "threads"));
  c.memory_bandwidth = j.at("memory_bandwidth").get<double>();
  in_range(c.memory_bandwidth, kMinBandwidth, kMaxBandwidth, at + "memory_bandwidth", "bytes/s");
  c.launch_s = j.value("launch_s", 0.0);
  in_range(c.launch_s, 0, kMaxLatency, at + "launch_s", "s");
  c.op_bandwidth = j.value("op_bandwidth", std::map<std::string, double>{});
  // 0: not measured (an operator with no traffic of its own); the memory bandwidth stands in.
  for (const auto& [op, bw] : c.op_bandwidth)
    if (bw != 0) in_range(bw, kMinBandwidth, kMaxBandwidth, at + "op_bandwidth." + op, "bytes/s");
  for (const auto& [dtype, rs] : j.at("gemm").items())
    for (const auto& r : rs) {
      const std::string key = fmt::format("{}gemm.{}[{}]", at, dtype, c.gemm[dtype].size());
      c.gemm[dtype].push_back({integer(r.at(0), key + "'s m"), integer(r.at(1), key + "'s n"),
                               integer(r.at(2), key + "'s k"), r.at(3).get<double>()});
      const GemmRate& g = c.gemm[dtype].back();
      require(g.m > 0 && g.n > 0 && g.k > 0, key + " has a shape that is not positive");
      in_range(g.flops_per_s, kMinRate, kMaxRate, key + "'s rate", "flop/s");
    }
  if (j.contains("attention"))
    for (const auto& [dtype, rs] : j.at("attention").items())
      for (const auto& r : rs) {
        const std::string key = fmt::format("{}attention.{}[{}]", at, dtype, c.attention[dtype].size());
        c.attention[dtype].push_back({integer(r.at(0), key + "'s seq"), integer(r.at(1), key + "'s head_dim"),
                                      r.at(2).get<double>(), r.at(3).get<double>()});
        require(r.at(0).get<int64_t>() > 0 && r.at(1).get<int64_t>() > 0, key + " has a shape that is not positive");
        in_range(r.at(2).get<double>(), kMinRate, kMaxRate, key + "'s forward rate", "flop/s");
        in_range(r.at(3).get<double>(), kMinRate, kMaxRate, key + "'s backward rate", "flop/s");
      }
  return c;
}

}  // namespace

nlohmann::json HardwareProfile::to_json() const {
  nlohmann::json j{{"format", kFormat},
                   {"version", kVersion},
                   {"device", device},
                   {"source", source},
                   {"host", host},
                   {"devices_per_node", devices_per_node},
                   {"nodes", nodes},
                   {"peak_flops", {{"fp32", peak_flops_fp32}, {"bf16", peak_flops_bf16}, {"fp16", peak_flops_fp16}}},
                   {"links", {{"intra_node", link_json(intra_node)}, {"inter_node", link_json(inter_node)}}}};
  if (cores > 0) j["cores"] = cores;  // 0: not known, written as absent (an explicit 0 is refused)
  j["compute"] = nlohmann::json::array();
  for (const ComputeProfile& c : compute) j["compute"].push_back(compute_json(c));
  j["collectives"] = nlohmann::json::array();
  for (const CollectiveFit& f : collectives)
    j["collectives"].push_back({{"op", to_string(f.op)}, {"ranks", f.ranks}, {"inter_node", f.inter_node},
                                {"latency_s", f.latency_s}, {"bandwidth", f.bandwidth}});
  return j;
}

// `source` names where the JSON came from (a file); a profile that is not one, of another
// version, or missing a field is a UserError there.
HardwareProfile HardwareProfile::from_json(const nlohmann::json& j, const std::string& source) {
  HardwareProfile p;
  try {
    require(j.is_object() && j.value("format", "") == kFormat,
            std::string("it is not a hardware profile (no \"format\": \"") + kFormat + "\")");
    const int64_t v = integer(j.at("version"), "version");
    require(v == kVersion, fmt::format("it is a version {} hardware profile; this runner reads version {}", v, kVersion));
    p.device = j.at("device").get<std::string>();
    p.source = j.value("source", source);
    p.host = j.value("host", "");
    p.devices_per_node = count_or(j, "devices_per_node", 1, 1);
    p.nodes = count_or(j, "nodes", 1, 1);

    const nlohmann::json& pk = j.at("peak_flops");
    p.peak_flops_fp32 = pk.at("fp32").get<double>();
    p.peak_flops_bf16 = pk.at("bf16").get<double>();
    p.peak_flops_fp16 = pk.at("fp16").get<double>();
    in_range(p.peak_flops_fp32, kMinRate, kMaxRate, "peak_flops.fp32", "flop/s");
    in_range(p.peak_flops_bf16, kMinRate, kMaxRate, "peak_flops.bf16", "flop/s");
    in_range(p.peak_flops_fp16, kMinRate, kMaxRate, "peak_flops.fp16", "flop/s");
    for (auto [name, link] : {std::pair{"intra_node", &p.intra_node}, std::pair{"inter_node", &p.inter_node}}) {
      const nlohmann::json& l = j.at("links").at(name);
      *link = {l.at("latency_s").get<double>(), l.at("bandwidth").get<double>()};
      in_range(link->latency_s, 0, kMaxLatency, std::string("links.") + name + ".latency_s", "s");
      in_range(link->bandwidth, kMinBandwidth, kMaxBandwidth, std::string("links.") + name + ".bandwidth", "bytes/s");
    }
    const bool cpu = p.device.rfind("cpu", 0) == 0;
    // Absent: not known (0; the cost model then counts this host's). A CPU profile that names
    // them prices ranks sharing them, so 0 or less there is refused; a GPU one may write 0.
    p.cores = static_cast<int>(count_or(j, "cores", 0, cpu ? 1 : 0));
    for (const auto& c : j.at("compute")) p.compute.push_back(compute_of(c, p.compute.size(), cpu));
    require(!p.compute.empty(), "it has no compute entries");
    for (const auto& f : j.value("collectives", nlohmann::json::array())) {
      const std::string at = fmt::format("collectives[{}]", p.collectives.size());
      p.collectives.push_back({collective_of(f.at("op").get<std::string>()), static_cast<int>(count(f.at("ranks"), 1, at + ".ranks")),
                               f.at("inter_node").get<bool>(), f.at("latency_s").get<double>(),
                               f.at("bandwidth").get<double>()});
      const CollectiveFit& c = p.collectives.back();
      const std::string& key = at;
      in_range(c.latency_s, 0, kMaxLatency, key + ".latency_s", "s");
      in_range(c.bandwidth, kMinBandwidth, kMaxBandwidth, key + ".bandwidth", "bytes/s");
    }
  } catch (const nlohmann::json::exception& e) {
    throw UserError(SourceLoc{source}, std::string("malformed hardware profile: ") + e.what(), kCalibrateFix);
  } catch (const std::invalid_argument& e) {
    throw UserError(SourceLoc{source}, std::string("malformed hardware profile: ") + e.what(), kCalibrateFix);
  }
  return p;
}

}  // namespace runner
