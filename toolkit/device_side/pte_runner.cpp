// edgetk's native .pte runner: an ExecuTorch program's method run by the ExecuTorch runtime alone (no torch,
// no Python), driven by the device's Python runner (edgetk_runner.py) through a framed pipe protocol.
//
//   edgetk-pte-runner PROGRAM.pte METHOD THREADS [profile]
//
// Built by the host (toolkit/delivery/pte_runner.py) against the runtime libraries of the exact executorch
// version that exported the program (the wheel's lib/ and include/), for the device's arch. docs/runner.md has
// the protocol; in short, every frame is a little-endian u32 length and that many bytes.
//
//   runner -> python: a reply: u32 json length, the JSON document, then the raw data its "tensors" or
//                     "times" describe. The first reply comes unasked, once the program and method loaded:
//                     {"ok", "executorch", "method", "load_ms", "backends", "inputs", "outputs", "peak_rss_kb"}.
//   python -> runner: a request: one opcode byte, then its arguments.
//     'I' set inputs: u32 count, then per tensor: u8 dtype (ExecuTorch ScalarType), u8 rank, rank x i64 sizes,
//         u64 byte count, the bytes.                                   -> {"ok"}
//     'R' run once: the outputs.  -> {"ok", "ms", "tensors": [{"dtype", "shape", "nbytes"}...]} + their bytes
//     'T' timed loop: u32 runs, f64 min seconds.   -> {"ok", "count"} + count f64 seconds, one per call
//     'P' per-operator times gathered so far (only with "profile"). -> {"ok", "ops": [{"name", "calls", "ns"}]}
//     'S' stats. -> {"ok", "peak_rss_kb"}
//     'Q' quit.
//   Any failure: {"ok": false, "error": TEXT, "code": ExecuTorch Error code or -1}; the runner keeps serving.

#include <executorch/devtools/etdump/etdump_flatcc.h>
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/backend/interface.h>

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#ifndef EDGETK_EXECUTORCH_VERSION
#define EDGETK_EXECUTORCH_VERSION "unknown"
#endif

using executorch::extension::TensorPtr;
using executorch::extension::module::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;

// The wheel ships libexecutorch_threadpool.so without its header: the two calls used here, as the library
// exports them (C++ mangling carries no return type).
namespace executorch {
namespace extension {
namespace threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t num_threads);
};
ThreadPool* get_threadpool();
}  // namespace threadpool
}  // namespace extension
}  // namespace executorch

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// This process's own peak resident memory in KiB: VmHWM, which starts afresh at exec (ru_maxrss does not: Linux
// carries the forking parent's peak across execve, and a Python parent's is tens of MB).
long peak_rss_kb() {
  if (FILE* status = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long kb = -1;
    while (std::fgets(line, sizeof line, status)) {
      if (std::sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    }
    std::fclose(status);
    if (kb >= 0) return kb;
  }
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

bool read_exact(void* into, size_t size) {
  char* at = static_cast<char*>(into);
  while (size) {
    ssize_t got = read(0, at, size);
    if (got <= 0) return false;
    at += got;
    size -= static_cast<size_t>(got);
  }
  return true;
}

void write_exact(const void* from, size_t size) {
  const char* at = static_cast<const char*>(from);
  while (size) {
    ssize_t put = write(1, at, size);
    if (put <= 0) std::exit(3);  // the Python side is gone
    at += put;
    size -= static_cast<size_t>(put);
  }
}

// One reply: the frame length, the JSON's length, the JSON, then the raw tail.
void reply(const std::string& json, const std::vector<std::pair<const void*, size_t>>& tail = {}) {
  uint64_t total = 4 + json.size();
  for (const auto& part : tail) total += part.second;
  uint32_t frame = static_cast<uint32_t>(total), json_size = static_cast<uint32_t>(json.size());
  write_exact(&frame, 4);
  write_exact(&json_size, 4);
  write_exact(json.data(), json.size());
  for (const auto& part : tail) write_exact(part.first, part.second);
}

void fail(const std::string& message, Error code = Error::Internal, bool known = true) {
  reply("{\"ok\": false, \"error\": " + quoted(message) + ", \"code\": " +
        std::to_string(known ? static_cast<int>(code) : -1) + "}");
}

template <typename Sizes>
std::string shape_json(const Sizes& sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

std::string tensor_info_json(const executorch::runtime::TensorInfo& info) {
  return "{\"dtype\": " + std::to_string(static_cast<int>(info.scalar_type())) + ", \"shape\": " +
         shape_json(info.sizes()) + "}";
}

// ETDump's generator with every profiled event also summed by name here (operators, delegate calls and the
// delegate's own operators), so the Python side needs no flatbuffer reader and no torch for a profile.
class SummingTracer : public executorch::etdump::ETDumpGen {
 public:
  struct Sum {
    long calls = 0;
    double ns = 0.0;
  };
  std::map<std::string, Sum> sums;

  executorch::runtime::EventTracerEntry start_profiling(const char* name, executorch::runtime::ChainID chain_id,
                                                        executorch::runtime::DebugHandle debug_handle) override {
    names_.push_back(name ? name : "?");
    return ETDumpGen::start_profiling(name, chain_id, debug_handle);
  }
  void end_profiling(executorch::runtime::EventTracerEntry entry) override {
    add(entry.start_time, executorch::runtime::pal_current_ticks());
    ETDumpGen::end_profiling(entry);
  }
  executorch::runtime::EventTracerEntry start_profiling_delegate(const char* name,
                                                                 executorch::runtime::DelegateDebugIntId index) override {
    names_.push_back(name ? name : "DELEGATE_EVENT");
    return ETDumpGen::start_profiling_delegate(name, index);
  }
  void end_profiling_delegate(executorch::runtime::EventTracerEntry entry, const void* metadata,
                              size_t metadata_len) override {
    add(entry.start_time, executorch::runtime::pal_current_ticks());
    ETDumpGen::end_profiling_delegate(entry, metadata, metadata_len);
  }
  void log_profiling_delegate(const char* name, executorch::runtime::DelegateDebugIntId index,
                              et_timestamp_t start, et_timestamp_t end, const void* metadata,
                              size_t metadata_len) override {
    names_.push_back(name ? name : "DELEGATE_EVENT");
    add(start, end);
    ETDumpGen::log_profiling_delegate(name, index, start, end, metadata, metadata_len);
  }

 private:
  std::vector<std::string> names_;
  void add(et_timestamp_t start, et_timestamp_t end) {
    if (names_.empty()) return;
    auto ratio = executorch::runtime::pal_ticks_to_ns_multiplier();
    Sum& sum = sums[names_.back()];
    names_.pop_back();
    sum.calls += 1;
    sum.ns += static_cast<double>(end - start) * ratio.numerator / ratio.denominator;
  }
};

struct Runner {
  Module* module;
  std::string method;
  SummingTracer* tracer;
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<TensorPtr> tensors;
  std::vector<EValue> inputs;

  void set_inputs() {
    uint32_t count = 0;
    if (!read_exact(&count, 4)) std::exit(0);
    buffers.assign(count, {});
    tensors.clear();
    inputs.clear();
    for (uint32_t i = 0; i < count; ++i) {
      uint8_t dtype = 0, rank = 0;
      uint64_t nbytes = 0;
      if (!read_exact(&dtype, 1) || !read_exact(&rank, 1)) std::exit(0);
      std::vector<int64_t> sizes(rank);
      if ((rank && !read_exact(sizes.data(), 8 * rank)) || !read_exact(&nbytes, 8)) std::exit(0);
      buffers[i].resize(nbytes ? nbytes : 1);
      if (nbytes && !read_exact(buffers[i].data(), nbytes)) std::exit(0);
      std::vector<executorch::aten::SizesType> dims(sizes.begin(), sizes.end());
      tensors.push_back(executorch::extension::from_blob(buffers[i].data(), dims,
                                                         static_cast<executorch::aten::ScalarType>(dtype)));
    }
    for (auto& tensor : tensors) inputs.emplace_back(tensor);
    reply("{\"ok\": true}");
  }

  void run_once() {
    auto start = Clock::now();
    auto result = module->execute(method, inputs);
    double ms = seconds_since(start) * 1000.0;
    if (!result.ok()) return fail("executing " + method + " failed", result.error());
    std::string json = "{\"ok\": true, \"ms\": " + std::to_string(ms) + ", \"tensors\": [";
    std::vector<std::pair<const void*, size_t>> tail;
    const auto& outputs = result.get();
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!outputs[i].isTensor()) return fail("output " + std::to_string(i) + " is not a tensor");
      const auto& tensor = outputs[i].toTensor();
      json += std::string(i ? ", " : "") + "{\"dtype\": " + std::to_string(static_cast<int>(tensor.scalar_type())) +
              ", \"shape\": " + shape_json(tensor.sizes()) + ", \"nbytes\": " + std::to_string(tensor.nbytes()) + "}";
      tail.emplace_back(tensor.const_data_ptr(), tensor.nbytes());
    }
    reply(json + "]}", tail);
  }

  void timed_loop() {
    uint32_t runs = 0;
    double min_time = 0.0;
    if (!read_exact(&runs, 4) || !read_exact(&min_time, 8)) std::exit(0);
    std::vector<double> times;
    times.reserve(runs);
    auto start = Clock::now();
    while (times.size() < runs || (seconds_since(start) < min_time && times.size() < 1000000)) {
      auto t0 = Clock::now();
      auto result = module->execute(method, inputs);
      times.push_back(seconds_since(t0));
      if (!result.ok()) return fail("executing " + method + " failed", result.error());
    }
    reply("{\"ok\": true, \"count\": " + std::to_string(times.size()) + "}",
          {{times.data(), times.size() * sizeof(double)}});
  }

  void profile() {
    if (!tracer) return fail("the runner was started without profile");
    std::string json = "{\"ok\": true, \"ops\": [";
    bool first = true;
    for (const auto& entry : tracer->sums) {
      std::ostringstream ns;
      ns.precision(17);
      ns << entry.second.ns;
      json += std::string(first ? "" : ", ") + "{\"name\": " + quoted(entry.first) + ", \"calls\": " +
              std::to_string(entry.second.calls) + ", \"ns\": " + ns.str() + "}";
      first = false;
    }
    reply(json + "]}");
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s PROGRAM.pte METHOD THREADS [profile]  (executorch %s)\n", argv[0],
                 EDGETK_EXECUTORCH_VERSION);
    return 2;
  }
  const std::string method = argv[2];
  const bool profiling = argc > 4 && std::string(argv[4]) == "profile";
  unsigned threads = static_cast<unsigned>(std::atoi(argv[3]));
  if (threads > 0) executorch::extension::threadpool::get_threadpool()->_unsafe_reset_threadpool(threads);
  auto start = Clock::now();
  SummingTracer* tracer = profiling ? new SummingTracer() : nullptr;
  Module module(argv[1], Module::LoadMode::Mmap,
                std::unique_ptr<executorch::runtime::EventTracer>(tracer));
  Error error = module.load_method(method);
  double load_ms = seconds_since(start) * 1000.0;
  std::string head = "{\"executorch\": " + quoted(EDGETK_EXECUTORCH_VERSION) + ", ";
  if (error != Error::Ok) {
    reply(head + "\"ok\": false, \"error\": " + quoted("loading " + method + " of the program failed") +
          ", \"code\": " + std::to_string(static_cast<int>(error)) + "}");
    return 0;
  }
  auto meta = module.method_meta(method);
  if (!meta.ok()) {
    reply(head + "\"ok\": false, \"error\": \"no method metadata\", \"code\": " +
          std::to_string(static_cast<int>(meta.error())) + "}");
    return 0;
  }
  std::string json = head + "\"ok\": true, \"method\": " + quoted(method) + ", \"load_ms\": " +
                     std::to_string(load_ms) + ", \"backends\": [";
  for (size_t i = 0; i < executorch::runtime::get_num_registered_backends(); ++i) {
    auto name = executorch::runtime::get_backend_name(i);
    json += std::string(i ? ", " : "") + quoted(name.ok() ? name.get() : "?");
  }
  json += "], \"inputs\": [";
  for (size_t i = 0; i < meta->num_inputs(); ++i) {
    auto info = meta->input_tensor_meta(i);
    if (!info.ok()) {
      reply(head + "\"ok\": false, \"error\": \"input " + std::to_string(i) + " is not a tensor\", \"code\": -1}");
      return 0;
    }
    json += std::string(i ? ", " : "") + tensor_info_json(info.get());
  }
  json += "], \"outputs\": [";
  for (size_t i = 0; i < meta->num_outputs(); ++i) {
    auto info = meta->output_tensor_meta(i);
    json += std::string(i ? ", " : "") + (info.ok() ? tensor_info_json(info.get()) : "null");
  }
  json += "], \"peak_rss_kb\": " + std::to_string(peak_rss_kb()) + "}";
  reply(json);

  Runner runner{&module, method, tracer, {}, {}, {}};
  for (;;) {
    uint32_t frame = 0;
    uint8_t op = 0;
    if (!read_exact(&frame, 4) || !read_exact(&op, 1)) return 0;
    switch (op) {
      case 'I': runner.set_inputs(); break;
      case 'R': runner.run_once(); break;
      case 'T': runner.timed_loop(); break;
      case 'P': runner.profile(); break;
      case 'S': reply("{\"ok\": true, \"peak_rss_kb\": " + std::to_string(peak_rss_kb()) + "}"); break;
      case 'Q': return 0;
      default: fail(std::string("unknown request ") + static_cast<char>(op)); return 2;
    }
  }
}
