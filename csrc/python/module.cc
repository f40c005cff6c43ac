// horovodlike._core; csrc/python/ is the only folder that includes pybind11. Frameworks hand
// raw pointers here; nothing in the core knows a framework type (run_plain, plain_tensor.h,
// reads a tensor's attributes by the names a framework layer registered).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "../common/interrupt.h"
#include "../core/message.h"
#include "../core/runtime.h"
#include "../collectives/provider_table.h"
#include "../cuda/nccl_api.h"
#include "../links/connect.h"
#include "../links/shm/shm_link.h"
#include "gpu.h"
#include "plain_tensor.h"
#include "testing.h"
#include "../common/backend_names.h"

namespace py = pybind11;
using namespace horovodlike;

namespace {

#ifndef HOROVODLIKE_VERSION
#define HOROVODLIKE_VERSION "0.0.0"
#endif

int64_t EnqueueCall(int op, const std::string& name, uintptr_t input, uintptr_t output, int dtype,
                    std::vector<int64_t> shape, int reduce_op, double prescale, double postscale,
                    int root_rank, int device, int process_set, std::vector<int64_t> splits,
                    int64_t group_id, int group_size, bool caller_waits, uintptr_t stream) {
  if (!IsValidDataType(dtype)) {
    throw InvalidArgument("tensor '" + name + "' has an unsupported dtype code " +
                          std::to_string(dtype));
  }
  if (reduce_op < 0 || reduce_op >= kNumReduceOps) {
    throw InvalidArgument("unknown reduce op " + std::to_string(reduce_op));
  }
  if (op < 0 || op >= kNumOpTypes) {
    throw InvalidArgument("unknown collective " + std::to_string(op));
  }
  EnqueueArgs args;
  args.op = static_cast<OpType>(op);
  args.name = name;
  args.input = reinterpret_cast<const void*>(input);
  args.output = reinterpret_cast<void*>(output);
  args.dtype = static_cast<DataType>(dtype);
  args.shape = std::move(shape);
  args.reduce_op = static_cast<ReduceOp>(reduce_op);
  args.prescale = prescale;
  args.postscale = postscale;
  args.root_rank = root_rank;
  args.device = device;
  args.process_set = process_set;
  args.splits = std::move(splits);
  args.group_id = group_id;
  args.group_size = group_size;
  args.caller_waits = caller_waits;
  args.stream = reinterpret_cast<void*>(stream);
  return Runtime::Get()->Enqueue(std::move(args));
}

// Blocking calls wake this often to let Python run its signal handlers: a handler runs only
// when the main thread is back in the interpreter, so without this Ctrl-C, SIGALRM
// (pytest-timeout) and SIGTERM handlers would wait for a collective that may never complete.
constexpr std::chrono::milliseconds kSignalCheckInterval(100);

// Throws the Python exception that is set (a signal handler's), with a note saying what was
// interrupted and what became of it.
[[noreturn]] void RaiseWithNote(const char* interrupted) {
  // KeyboardInterrupt is raised without an instance; make one to carry the note.
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != nullptr) PyException_SetTraceback(value, traceback);
  PyErr_Restore(type, value, traceback);
  py::error_already_set error;
  if (py::hasattr(error.value(), "add_note")) {
    error.value().attr("add_note")(std::string("(raised while horovodlike ") + interrupted + ")");
  }
  throw error;
}

// Runs Python's pending signal handlers (the GIL is held); when one raises, rethrows its
// exception with a note.
void CheckSignals(const char* interrupted) {
  if (PyErr_CheckSignals() == 0) return;
  RaiseWithNote(interrupted);
}

// The interrupt check of a caller that runs negotiation rounds while it waits
// (Runtime::WaitDriving): from inside a long link wait, at most every kSignalCheckInterval,
// takes the GIL and runs the pending signal handlers; keeps the exception one raised.
struct SignalsDuringRound {
  std::chrono::steady_clock::time_point next_check;  // the first Check looks at once
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;

  static bool Check(void* context) {
    auto* self = static_cast<SignalsDuringRound*>(context);
    if (self->type != nullptr) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now < self->next_check) return false;
    self->next_check = now + kSignalCheckInterval;
    py::gil_scoped_acquire acquire;
    if (PyErr_CheckSignals() == 0) return false;
    PyErr_Fetch(&self->type, &self->value, &self->traceback);
    return true;
  }
};

// The waits this process has completed (wait(), run(), run_plain()); read with the GIL held.
uint64_t g_waits = 0;

// Waits for the handle (see wait() below) and returns its state.
std::shared_ptr<HandleState> WaitState(int64_t handle) {
  std::shared_ptr<HandleState> state;
  HandleTable::BlockedWaiter blocked;
  // The first slice runs the rounds for this handle on this thread; if a peer is late, the
  // loop goes on with them and the later slices only wait, so that a signal then interrupts
  // the wait, never a round.
  for (bool first = true;; first = false) {
    SignalsDuringRound signals;
    {
      py::gil_scoped_release release;
      ScopedInterruptCheck check(&SignalsDuringRound::Check, &signals);
      state = Runtime::Get()->WaitDriving(handle, kSignalCheckInterval.count() / 1000.0, first);
    }
    if (signals.type != nullptr) {
      PyErr_Restore(signals.type, signals.value, signals.traceback);
      RaiseWithNote("ran a negotiation round on this thread while it waited for a collective; "
                    "the round could not be finished, so horovodlike stopped on this rank and "
                    "the other ranks fail too: call shutdown() (and init() to start again)");
    }
    if (state) {
      // GPU work: the caller's stream waits for the core's completion event.
      if (state->completion_event) GpuCompletions::AfterWait(*state);
      ++g_waits;
      break;
    }
    CheckSignals("waited for a collective to complete; it is still pending on this rank, and "
                 "its buffers stay alive until it completes or shutdown() is called");
  }
  return state;
}

py::tuple WaitCall(int64_t handle) {
  const std::shared_ptr<HandleState> state = WaitState(handle);
  return py::make_tuple(static_cast<int>(state->status.code), state->status.message);
}

}  // namespace

// enqueue + wait + release in one call, for the framework layers' synchronous collectives
// whose output is the caller's own buffer (allreduce, broadcast): one crossing into C++
// instead of three, and this thread runs the rounds (caller_waits). Call it with positional
// arguments: pybind11 looks every keyword up by name, which costs more than a small collective.
// When the wait is interrupted the operation may still be pending: the handle is kept (and
// the caller keeps the buffers alive), as with wait().
py::object horovodlike::RunCall(int op, const std::string& name, uintptr_t input,
                                uintptr_t output, int dtype, std::vector<int64_t> shape,
                                int reduce_op, double prescale, double postscale, int root_rank,
                                int device, int process_set, uintptr_t stream) {
  const int64_t handle = EnqueueCall(op, name, input, output, dtype, std::move(shape), reduce_op,
                                     prescale, postscale, root_rank, device, process_set, {}, 0,
                                     0, /*caller_waits=*/true, stream);
  const std::shared_ptr<HandleState> state = WaitState(handle);
  Runtime::Get()->handles().Release(handle);
  if (state->status.ok()) return py::none();
  return py::make_tuple(static_cast<int>(state->status.code), state->status.message);
}

namespace {

// run() as the interpreter calls a C function with METH_FASTCALL: the arguments arrive as an
// array, without the tuple, the keyword lookups and the per-argument casters of pybind11's
// dispatcher, which cost about as much as the core's own work for a small collective. Takes
// the framework layers' form: 12 positional arguments (ints, a str, a tuple or list of ints,
// floats) and an optional `stream` (13th, or the one keyword). Anything else goes to pybind11's
// binding of RunCall (g_run_checked), whose conversions and errors stay the reference.
PyObject* g_run_checked = nullptr;

}  // namespace

bool horovodlike::ArgInt(PyObject* arg, long long& out) {
  if (!PyLong_Check(arg)) return false;
  int overflow = 0;
  out = PyLong_AsLongLongAndOverflow(arg, &overflow);
  if (overflow != 0 || (out == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  return true;
}

namespace {

bool ArgPointer(PyObject* arg, uintptr_t& out) {
  long long value = 0;
  if (!ArgInt(arg, value) || value < 0) return false;
  out = static_cast<uintptr_t>(value);
  return true;
}

bool ArgShape(PyObject* arg, std::vector<int64_t>& shape) {
  if (!PyTuple_Check(arg) && !PyList_Check(arg)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(arg);
  PyObject** items = PySequence_Fast_ITEMS(arg);
  shape.resize(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    long long dim = 0;
    if (!ArgInt(items[i], dim)) return false;
    shape[static_cast<size_t>(i)] = dim;
  }
  return true;
}

PyObject* RunFast(PyObject*, PyObject* const* args, Py_ssize_t given, PyObject* kwnames) {
  // Positional arguments, the keyword `stream` counted as the 13th; 0: another form.
  Py_ssize_t nargs = kwnames == nullptr ? given : 0;
  PyObject* stream_arg = given == 13 && kwnames == nullptr ? args[12] : nullptr;
  if (kwnames != nullptr && given == 12 && PyTuple_GET_SIZE(kwnames) == 1 &&
      PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "stream") == 0) {
    nargs = 13;
    stream_arg = args[12];
  }
  long long ints[6] = {0, 0, 0, 0, 0, 0};  // op, dtype, reduce_op, root, device, set
  uintptr_t input = 0, output = 0, stream = 0;
  std::vector<int64_t> shape;
  const char* name = nullptr;
  Py_ssize_t name_size = 0;
  const bool parsed =
      (nargs == 12 || nargs == 13) && ArgInt(args[0], ints[0]) && PyUnicode_Check(args[1]) &&
      (name = PyUnicode_AsUTF8AndSize(args[1], &name_size)) != nullptr &&
      ArgPointer(args[2], input) && ArgPointer(args[3], output) && ArgInt(args[4], ints[1]) &&
      ArgShape(args[5], shape) && ArgInt(args[6], ints[2]) && PyFloat_Check(args[7]) &&
      PyFloat_Check(args[8]) && ArgInt(args[9], ints[3]) && ArgInt(args[10], ints[4]) &&
      ArgInt(args[11], ints[5]) && (stream_arg == nullptr || ArgPointer(stream_arg, stream));
  auto fits_int = [](long long v) { return v >= INT32_MIN && v <= INT32_MAX; };
  if (!parsed || !fits_int(ints[0]) || !fits_int(ints[1]) || !fits_int(ints[2]) ||
      !fits_int(ints[3]) || !fits_int(ints[4]) || !fits_int(ints[5])) {
    PyErr_Clear();
    return PyObject_Vectorcall(g_run_checked, args, static_cast<size_t>(given), kwnames);
  }
  try {
    py::object result = RunCall(
        static_cast<int>(ints[0]), std::string(name, static_cast<size_t>(name_size)), input,
        output, static_cast<int>(ints[1]), std::move(shape), static_cast<int>(ints[2]),
        PyFloat_AS_DOUBLE(args[7]), PyFloat_AS_DOUBLE(args[8]), static_cast<int>(ints[3]),
        static_cast<int>(ints[4]), static_cast<int>(ints[5]), stream);
    return result.release().ptr();
  } catch (...) {
    py::detail::try_translate_exceptions();  // as pybind11's dispatcher does
    return nullptr;
  }
}

// Replaces the module's `run` (pybind11's binding of RunCall) by RunFast, the binding kept as
// its fallback.
void RouteRunThroughRunFast(py::module_& m) {
  g_run_checked = py::object(m.attr("run")).release().ptr();
  static PyMethodDef run_def = {
      "run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&RunFast)),
      METH_FASTCALL | METH_KEYWORDS,
      "run(op: int, name: str, input: int, output: int, dtype: int, shape: Sequence[int], "
      "reduce_op: int, prescale: float, postscale: float, root_rank: int, device: int, "
      "process_set: int, stream: int = 0) -> tuple | None\n\n"
      "enqueue + wait + release: runs a collective whose output is the caller's buffer; "
      "returns None, or (status code, message) when it failed. Pass every argument "
      "positionally, the floats as floats (faster)."};
  AddCFunction(m, &run_def);
}

// init() runs on a thread of its own while the caller's thread wakes for signals: the
// rendezvous may wait for the other ranks up to HOROVOD_START_TIMEOUT. An attempt abandoned by
// an exception from a signal handler finishes in the background; a shutdown() asked for
// meanwhile is carried out by that thread when the attempt ends, so the process never waits
// for it (an exiting process calls shutdown() from atexit).
struct InitAttempt {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  bool shutdown_requested = false;
  std::exception_ptr error;
};
std::mutex g_init_mutex;
std::shared_ptr<InitAttempt> g_init_in_flight;

void InitCall() {
  std::shared_ptr<InitAttempt> attempt;
  {
    std::lock_guard<std::mutex> lock(g_init_mutex);
    if (!g_init_in_flight) {
      g_init_in_flight = std::make_shared<InitAttempt>();
      std::thread([attempt = g_init_in_flight] {
        std::exception_ptr error;
        try {
          Runtime::Init();
        } catch (...) {
          error = std::current_exception();
        }
        bool shutdown = false;
        {
          std::lock_guard<std::mutex> lock(g_init_mutex);
          if (g_init_in_flight == attempt) g_init_in_flight.reset();
          std::lock_guard<std::mutex> done_lock(attempt->mutex);
          attempt->done = true;
          attempt->error = error;
          shutdown = attempt->shutdown_requested;
        }
        attempt->done_cv.notify_all();
        if (shutdown) Runtime::Shutdown();
      }).detach();
    }
    attempt = g_init_in_flight;
  }
  while (true) {
    bool done = false;
    {
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(attempt->mutex);
      done = attempt->done_cv.wait_for(lock, kSignalCheckInterval, [&] { return attempt->done; });
    }
    if (done) break;
    CheckSignals("waited in init() for the other ranks to connect");
  }
  if (attempt->error) std::rethrow_exception(attempt->error);
}

void ShutdownCall() {
  {
    std::lock_guard<std::mutex> lock(g_init_mutex);
    if (g_init_in_flight) {  // an interrupted init(): its thread shuts down when it ends
      std::lock_guard<std::mutex> done_lock(g_init_in_flight->mutex);
      g_init_in_flight->shutdown_requested = true;
      return;
    }
  }
  py::gil_scoped_release release;
  Runtime::Shutdown();
}

// An output the core allocated (allgather, alltoall, reducescatter) as a NumPy uint8 array that
// keeps the core's buffer alive (no copy), its shape, and the op's integers: each rank's first
// dimension (allgather), the received splits (alltoall), the last rank to join (join), the new
// process set's id (add_process_set).
py::tuple Output(int64_t handle) {
  auto state = Runtime::Get()->handles().Get(handle);
  auto* keep = new std::shared_ptr<HandleState>(state);
  py::capsule owner(keep, [](void* p) { delete static_cast<std::shared_ptr<HandleState>*>(p); });
  py::array_t<uint8_t> bytes({static_cast<py::ssize_t>(state->output.size())},
                             {static_cast<py::ssize_t>(1)}, state->output.data(), owner);
  return py::make_tuple(bytes, state->output_shape, state->integers);
}

PointToPoint::Message P2PMessage(int set_id, int peer, int tag, int dtype,
                                 std::vector<int64_t> shape) {
  if (!IsValidDataType(dtype)) {
    throw InvalidArgument("point-to-point: unsupported dtype code " + std::to_string(dtype));
  }
  PointToPoint::Message message;
  message.set_id = set_id;
  message.peer = peer;
  message.tag = tag;
  message.dtype = static_cast<DataType>(dtype);
  message.shape = std::move(shape);
  return message;
}

// _core.stats(): counters since init, the tuned parameters in force and the provider runs.
py::dict Stats() {
  auto runtime = Runtime::Get();
  auto s = runtime->stats();
  py::dict d;
  d["allreduce_collectives"] = s.allreduce_collectives;
  d["allreduce_tensors"] = s.allreduce_tensors;
  d["errors"] = s.errors;
  // The tuned parameters in force on this rank (the same on every rank after each round).
  auto tuned = runtime->tuned();
  d["fusion_threshold_bytes"] = tuned.parameters.fusion_threshold_bytes;
  d["cycle_time_ms"] = tuned.parameters.cycle_time_ms;
  d["cache_enabled"] = tuned.parameters.cache_enabled;
  d["parameters_round"] = tuned.round;
  d["autotune"] = runtime->config().autotune;
  d["autotune_done"] = runtime->config().autotune && !tuned.parameters.tuning;
  d["hierarchical_allreduces"] = s.hierarchical_allreduces;
  d["hierarchical_allgathers"] = s.hierarchical_allgathers;
  // Runs per provider label since the process started ("SHM_ALLREDUCE", "TCP_RING_ALLREDUCE"):
  // which algorithm ran, over which link.
  py::dict runs;
  for (const auto& [label, count] : ProviderTable::Runs()) runs[py::str(label)] = count;
  d["provider_runs"] = runs;
  d["fusion_buffer_bytes"] = s.fusion_buffer_bytes;
  d["early_staged_allreduces"] = s.early_staged_allreduces;
  // Negotiation rounds run by the background loop and by waiting callers (WaitDriving).
  const Runtime::RoundCounts rounds = runtime->round_counts();
  d["loop_rounds"] = rounds.loop;
  d["caller_rounds"] = rounds.caller;
  // The loop's wait between rounds now: the cycle time, stretched while idle (runtime.h).
  d["loop_cycle_us"] = rounds.loop_cycle_us;
  // Round bells this rank rang to peers on other hosts (links/tcp/network_bell.h); absent
  // without a TCP mesh.
  if (runtime->network_bells() >= 0) d["network_round_bells"] = runtime->network_bells();
  // How the ranks of this host wait for each other (links/shm/shm_link.h); absent without one.
  if (const ShmLink* shm = runtime->shared_memory()) {
    d["shm_spins"] = shm->spins();
    d["shm_host_cores"] = shm->host_cores();
    d["shm_cpu_moves"] = shm->cpu_moves();
    d["shm_sleeps"] = shm->sleeps();
    d["shm_busy_sleeps"] = shm->busy_sleeps();
    // Round bells this rank rang: its rounds waited for a peer of the host in no round.
    d["shm_round_bells"] = shm->round_bells();
    // Poll bells this rank rang: a host peer waited in poll() for peers on other hosts too
    // (links/shm/shm_bell.h).
    d["shm_poll_bells"] = shm->poll_bells();
  }
  return d;
}

// _core.build_info(): what this build has, and what the running job uses.
py::dict BuildInfo() {
  py::dict info;
  info["version"] = HOROVODLIKE_VERSION;
  info[NameOf(Backend::kTcp)] = true;
  info["shm"] = true;  // shared memory between the ranks of a host: always built
#ifdef HOROVODLIKE_MPI_FOUND
  info[NameOf(Backend::kMpi)] = true;
#else
  info[NameOf(Backend::kMpi)] = false;
#endif
#ifdef HOROVODLIKE_GLOO_FOUND
  info[NameOf(Backend::kGloo)] = true;
#else
  info[NameOf(Backend::kGloo)] = false;
#endif
  info["nccl"] = NcclStatus().found;
  info["cuda"] = CudaStatus().found;
  // HOROVOD_HIERARCHICAL_ALLREDUCE over the built-in transport (always built in).
  info["hierarchical_allreduce"] = true;
  info["hierarchical_allgather"] = true;
  // The link of the running job ("tcp", "shm", "shm+tcp", "mpi", "gloo"), None before
  // init().
  const char* in_use = Runtime::IsInitialized() ? LastLinkName() : nullptr;
  info["cpu_operations"] = in_use != nullptr ? py::object(py::str(in_use)) : py::none();
  // What point-to-point messages travel over ("shm", "shm+tcp", "tcp"), None before init() or
  // in a job of one rank.
  const char* p2p = Runtime::IsInitialized() ? Runtime::Get()->PointToPointLinkName() : nullptr;
  info["point_to_point"] = p2p != nullptr ? py::object(py::str(p2p)) : py::none();
  // The collective providers: what the build has, and what the running job's table chose.
  auto pairs = [](const std::vector<std::pair<std::string, std::string>>& entries) {
    py::list list;
    for (const auto& [op, providers] : entries) list.append(py::make_tuple(op, providers));
    return list;
  };
  // As HOROVOD_CPU_OPERATIONS would have them (a bad value is init()'s to report).
  std::string cpu_operations;
  try {
    cpu_operations = CpuOperationsFromEnvironment();
  } catch (const InvalidArgument&) {
  }
  info["providers"] = pairs(ProviderTable::Available(cpu_operations));
  info["providers_in_use"] = Runtime::IsInitialized()
                                 ? py::object(pairs(ProviderTable::ForRunningJob()))
                                 : py::none();
  return info;
}

void DefineConstants(py::module_& m) {
  // The numbering of the core, the one source of these constants for the Python layers
  // (horovodlike/common/constants.py): dtypes, reduce ops and collectives by name.
  py::dict dtypes, reduce_ops, ops;
  py::list floating;
  for (int code = 0; code < kNumDataTypes; ++code) {
    const auto dtype = static_cast<DataType>(code);
    dtypes[DataTypeName(dtype)] = code;
    if (IsFloatingPoint(dtype)) floating.append(DataTypeName(dtype));
  }
  for (int code = 0; code < kNumReduceOps; ++code) {
    reduce_ops[ReduceOpName(static_cast<ReduceOp>(code))] = code;
  }
  for (int code = 0; code < kNumOpTypes; ++code) {
    ops[OpTypeName(static_cast<OpType>(code))] = code;
  }
  m.attr("DTYPES") = dtypes;
  m.attr("FLOATING_DTYPES") = py::tuple(floating);
  m.attr("REDUCE_OPS") = reduce_ops;
  m.attr("OPS") = ops;
  // The longest name a collective may have, in UTF-8 bytes (what a message carries).
  m.attr("MAX_NAME_BYTES") = kMaxWireStringBytes;
  m.attr("STATUS_OK") = static_cast<int>(StatusCode::kOk);
  m.attr("STATUS_INVALID_ARGUMENT") = static_cast<int>(StatusCode::kInvalidArgument);
  m.attr("STATUS_MISMATCH") = static_cast<int>(StatusCode::kMismatch);
  m.attr("STATUS_INTERNAL") = static_cast<int>(StatusCode::kInternal);
  m.attr("STATUS_SHUTDOWN") = static_cast<int>(StatusCode::kShutdown);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "horovodlike native core";
  m.def("init", &InitCall,
        "Connects to the other ranks; wakes every 100 ms for Python's signal handlers.");
  m.def("shutdown", &ShutdownCall);
  m.def("is_initialized", &Runtime::IsInitialized);
  m.def("rank", [] { return Runtime::Get()->config().rank; });
  m.def("size", [] { return Runtime::Get()->config().size; });
  m.def("local_rank", [] { return Runtime::Get()->config().local_rank; });
  m.def("local_size", [] { return Runtime::Get()->config().local_size; });
  m.def("cross_rank", [] { return Runtime::Get()->config().cross_rank; });
  m.def("cross_size", [] { return Runtime::Get()->config().cross_size; });
  m.def("enqueue", &EnqueueCall, py::arg("op"), py::arg("name"), py::arg("input"),
        py::arg("output"), py::arg("dtype"), py::arg("shape"), py::arg("reduce_op") = 1,
        py::arg("prescale") = 1.0, py::arg("postscale") = 1.0, py::arg("root_rank") = 0,
        py::arg("device") = -1, py::arg("process_set") = 0,
        py::arg("splits") = std::vector<int64_t>(), py::arg("group_id") = 0,
        py::arg("group_size") = 0, py::arg("caller_waits") = false, py::arg("stream") = 0);
  // Join and process-set changes: control operations, with their own arguments (no tensor).
  m.def("enqueue_control", [](int op, const std::string& name, std::vector<int32_t> ranks,
                              int process_set_id) {
    if (op < 0 || op >= kNumOpTypes) {
      throw InvalidArgument("unknown operation " + std::to_string(op));
    }
    ControlRequest control;
    control.ranks = std::move(ranks);
    control.process_set_id = process_set_id;
    return Runtime::Get()->EnqueueControl(static_cast<OpType>(op), name, std::move(control));
  }, py::arg("op"), py::arg("name"), py::arg("ranks") = std::vector<int32_t>(),
     py::arg("process_set_id") = -1);
  m.def("waits", [] { return g_waits; },
        "The number of waits this process has completed (wait(), run(), run_plain()): a name "
        "whose operation is done is released once this count has moved past its enqueue.");
  m.def("wait", &WaitCall, py::arg("handle"),
        "Blocks (without the GIL, waking every 100 ms for Python's signal handlers) until the "
        "handle is done; returns (status code, message).");
  m.def("send", [](int set_id, int peer, int tag, uintptr_t data, int dtype,
                   std::vector<int64_t> shape) {
    return Runtime::Get()->Send(P2PMessage(set_id, peer, tag, dtype, std::move(shape)),
                               reinterpret_cast<const void*>(data));
  }, py::arg("process_set"), py::arg("peer"), py::arg("tag"), py::arg("data"), py::arg("dtype"),
     py::arg("shape"));
  m.def("recv", [](int set_id, int peer, int tag, uintptr_t data, int dtype,
                   std::vector<int64_t> shape) {
    return Runtime::Get()->Recv(P2PMessage(set_id, peer, tag, dtype, std::move(shape)),
                               reinterpret_cast<void*>(data));
  }, py::arg("process_set"), py::arg("peer"), py::arg("tag"), py::arg("data"), py::arg("dtype"),
     py::arg("shape"), "data 0: the core allocates the output with the sender's dtype and shape.");
  m.def("notify_failure", [](int set_id, const std::string& reason) {
    Runtime::Get()->NotifyPointToPointFailure(set_id, reason);
  });
  m.def("wait_for", [](int64_t handle, double seconds) -> py::object {
    std::shared_ptr<HandleState> state;
    {
      py::gil_scoped_release release;
      state = Runtime::Get()->handles().WaitFor(handle, seconds);
    }
    if (!state) return py::none();
    if (state->completion_event) GpuCompletions::AfterWait(*state);
    return py::make_tuple(static_cast<int>(state->status.code), state->status.message);
  }, py::arg("handle"), py::arg("seconds"),
     "Like wait, but returns None when the handle is not done within `seconds`.");
  m.def("poll", [](int64_t handle) { return Runtime::Get()->handles().Poll(handle); });
  m.def("release", [](int64_t handle) { Runtime::Get()->handles().Release(handle); });
  m.def("run", &RunCall, py::arg("op"), py::arg("name"), py::arg("input"), py::arg("output"),
        py::arg("dtype"), py::arg("shape"), py::arg("reduce_op"), py::arg("prescale"),
        py::arg("postscale"), py::arg("root_rank"), py::arg("device"), py::arg("process_set"),
        py::arg("stream") = 0,
        "enqueue + wait + release: runs a collective whose output is the caller's buffer; "
        "returns None, or (status code, message) when it failed. Pass every argument "
        "positionally (faster).");
  RouteRunThroughRunFast(m);
  m.def("output", &Output);
  m.def("start_timeline", [](const std::string& path, bool mark_cycles) {
    py::gil_scoped_release release;  // may wait for a previous recording's writer to finish
    Runtime::Get()->StartTimeline(path, mark_cycles);
  }, py::arg("file_path"), py::arg("mark_cycles") = false);
  m.def("stop_timeline", [] {
    py::gil_scoped_release release;
    Runtime::Get()->StopTimeline();
  });
  m.def("process_set_ranks", [](int id) { return Runtime::Get()->ProcessSetRanks(id); });
  m.def("process_set_ids", [] { return Runtime::Get()->ProcessSetIds(); });
  m.def("stats", &Stats);
  m.def("build_info", &BuildInfo);
  DefineConstants(m);

  // Test-only entry points live in their own submodule (testing.cc).
  DefineTestingModule(m);
  DefineGpuFunctions(m);
  DefinePlainTensorFunctions(m);
}
