#include "testing.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <chrono>
#include <thread>

#include "../common/hmac.h"
#include "../core/message.h"
#include "../core/parameter_manager.h"
#include "../core/runtime.h"

namespace py = pybind11;

namespace horovodlike {
namespace {

py::bytes ToBytes(const std::vector<uint8_t>& bytes) {
  return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// Decodes arbitrary bytes and returns them encoded again; ValueError when they are malformed.
template <typename Decode, typename Encode>
py::bytes RoundTrip(py::bytes data, Decode decode, Encode encode) {
  std::string raw = data;
  WireWriter out;
  try {
    encode(decode(reinterpret_cast<const uint8_t*>(raw.data()), raw.size()), out);
  } catch (const TransportError& e) {
    throw py::value_error(e.what());
  }
  return ToBytes(out.bytes());
}

// Runs the autotuner's decisions without a job, scoring each point with
// `score(fusion_threshold_bytes, cycle_time_ms, cache_enabled)`; returns the samples as
// (fusion threshold, cycle time, cache, score) and the parameters it settled on.
py::tuple Autotune(py::function score, int max_samples, double noise, int warmup_samples,
                   bool tune_cache, std::string log_file, py::object fixed_fusion,
                   py::object fixed_cycle) {
  Config config;
  config.autotune = true;
  config.autotune_max_samples = max_samples;
  config.autotune_noise = noise;
  config.autotune_warmup_samples = warmup_samples;
  config.autotune_log = log_file;
  config.cache_capacity_given = !tune_cache;
  if (!fixed_fusion.is_none()) {
    config.fusion_threshold_bytes = fixed_fusion.cast<int64_t>();
    config.fusion_threshold_given = true;
  }
  if (!fixed_cycle.is_none()) {
    config.cycle_time_ms = fixed_cycle.cast<double>();
    config.cycle_time_given = true;
  }
  TunedParameters initial;
  initial.fusion_threshold_bytes = config.fusion_threshold_bytes;
  initial.cycle_time_ms = config.cycle_time_ms;
  ParameterManager manager(config, initial);
  for (int i = 0; manager.tuning() && i < 100000; ++i) {
    const TunedParameters& p = manager.current();
    manager.RecordScore(
        score(p.fusion_threshold_bytes, p.cycle_time_ms, p.cache_enabled).cast<double>());
  }
  py::list samples;
  for (const auto& s : manager.samples()) {
    samples.append(py::make_tuple(s.parameters.fusion_threshold_bytes,
                                  s.parameters.cycle_time_ms, s.parameters.cache_enabled,
                                  s.score));
  }
  const TunedParameters& chosen = manager.current();
  return py::make_tuple(samples, py::make_tuple(chosen.fusion_threshold_bytes,
                                                chosen.cycle_time_ms, chosen.cache_enabled,
                                                chosen.tuning));
}

// Takes the runtime, calls `started()`, waits `seconds` without the GIL (a shutdown() may run
// meanwhile), then uses the runtime it still holds: a barrier, whose status code it returns.
int HoldRuntime(double seconds, py::function started) {
  std::shared_ptr<Runtime> runtime = Runtime::Get();
  started();
  py::gil_scoped_release release;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  EnqueueArgs args;
  args.op = OpType::kBarrier;
  args.name = "held.barrier";
  args.dtype = DataType::kUInt8;
  args.shape = {0};
  const int64_t handle = runtime->Enqueue(std::move(args));
  const int code = static_cast<int>(runtime->handles().Wait(handle)->status.code);
  runtime->handles().Release(handle);
  return code;
}

// The link API's tagged messages, straight on the link point-to-point uses: posts a receive
// from `peer` for each of `receives` ((tag, bytes)), in that order, then sends each of `sends`
// ((tag, payload)) to it, then waits for all (test() on the sends while the receives are
// waited for in order). Returns the payloads received, in the receives' order; a failure
// (TransportError: a size mismatch, a lost peer) is a RuntimeError. Tags 0 and 1 are
// point-to-point's own.
py::list TaggedExchange(int peer, const std::vector<std::pair<int, py::bytes>>& sends,
                        const std::vector<std::pair<int, size_t>>& receives) {
  Link* link = Runtime::Get()->TaggedLink();
  if (link == nullptr) throw py::value_error("this job's link has no tagged messages");
  std::vector<std::string> out;
  for (const auto& send : sends) out.push_back(std::string(send.second));
  std::vector<std::string> in;
  for (const auto& receive : receives) in.emplace_back(receive.second, '\0');
  {
    py::gil_scoped_release release;
    std::vector<std::unique_ptr<Link::Request>> posted, sent;
    for (size_t i = 0; i < receives.size(); ++i) {
      posted.push_back(link->irecv(peer, receives[i].first, in[i].data(), in[i].size()));
    }
    for (size_t i = 0; i < sends.size(); ++i) {
      sent.push_back(link->isend(peer, sends[i].first, out[i].data(), out[i].size()));
    }
    for (auto& request : posted) request->wait();
    for (auto& request : sent) {
      while (!request->test()) link->progress(10);
    }
  }
  py::list result;
  for (const std::string& bytes : in) result.append(py::bytes(bytes));
  return result;
}

// Posts a receive from `peer` on `tag` into a buffer of its own, and gives it up at once (the
// request and the buffer go): the next message of that tag must reach the next receive.
void TaggedWithdraw(int peer, int tag, size_t n) {
  Link* link = Runtime::Get()->TaggedLink();
  if (link == nullptr) throw py::value_error("this job's link has no tagged messages");
  std::vector<uint8_t> buffer(n, 0);
  link->irecv(peer, tag, buffer.data(), n).reset();
}

}  // namespace

void DefineTestingModule(py::module_& core) {
  py::module_ m = core.def_submodule("_testing", "test-only entry points; not an API");
  m.def("decode_requests", [](py::bytes data) {
    return RoundTrip(data, DecodeRequests, EncodeRequests);
  });
  m.def("decode_responses", [](py::bytes data) {
    return RoundTrip(data, DecodeResponses, EncodeResponses);
  });
  m.def("sha256", [](py::bytes data) {
    Sha256Digest digest = Sha256(std::string(data));
    return py::bytes(reinterpret_cast<const char*>(digest.data()), digest.size());
  });
  m.def("hmac_sha256", [](py::bytes key, py::bytes message) {
    Sha256Digest mac = HmacSha256(std::string(key), std::string(message));
    return py::bytes(reinterpret_cast<const char*>(mac.data()), mac.size());
  });
  m.def("autotune", &Autotune, py::arg("score"), py::arg("max_samples") = 20,
        py::arg("noise") = 0.8, py::arg("warmup_samples") = 0, py::arg("tune_cache") = true,
        py::arg("log_file") = "", py::arg("fixed_fusion") = py::none(),
        py::arg("fixed_cycle") = py::none());
  m.def("hold_runtime", &HoldRuntime, py::arg("seconds"), py::arg("started"));
  m.def("tagged_exchange", &TaggedExchange, py::arg("peer"), py::arg("sends"),
        py::arg("receives"));
  m.def("tagged_withdraw", &TaggedWithdraw, py::arg("peer"), py::arg("tag"), py::arg("n"));
  m.def("core_to_core_round_trip_ns", &CoreToCoreRoundTripNs, py::arg("cpu_a"),
        py::arg("cpu_b"), py::arg("round_trips") = 4000, py::arg("batches") = 5,
        py::call_guard<py::gil_scoped_release>());
}

}  // namespace horovodlike
