// idist-run's settings from the environment and from a JSON launch profile (see config.hpp).
#include "idist/launchers/config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "idist/launchers/etcd_rendezvous.hpp"
#include "idist/launchers/program.hpp"
#include "idist/launchers/rendezvous.hpp"
#include "idist/launchers/resources.hpp"
#include "parse_whole.hpp"

namespace idist::launchers::config {
namespace {

using json = nlohmann::json;

// A profile is a few lines; the bound keeps `--config /dev/zero` from eating the memory.
constexpr std::size_t kMaxFileBytes = 1 << 20;
// A profile nests two deep ("program": [...]). The bound keeps a file of 100,000 '[' from
// becoming a value that anything recursive (dump, for an error) would overflow the stack on.
constexpr int kMaxDepth = 64;

struct TooDeep {};

std::string dashed(std::string_view key) {
  std::string out(key);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

const Setting* find_setting(std::string_view key) {
  const std::string canonical = [&] {
    std::string out(key);
    std::replace(out.begin(), out.end(), '-', '_');
    return out;
  }();
  for (const auto& setting : kSettings)
    if (setting.key == canonical) return &setting;
  return nullptr;
}

std::string_view type_words(Type type) {
  switch (type) {
    case Type::integer: return "an integer";
    case Type::count_or_auto: return "an integer or \"auto\"";
    case Type::count_or_range: return "an integer or \"MIN:MAX\"";
    case Type::number: return "a number";
    case Type::string: return "a string";
    case Type::boolean: return "true or false";
  }
  return "?";
}

// A JSON value as an error shows it: short, on one line.
std::string shown(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return fmt::format("{} {}", value.type_name(), text);
}

// `value` as the option would read it on the command line, or nullopt when it is not of
// `type`. An integral float (4.0) is an integer, as JSON Schema counts it.
std::optional<std::string> as_text(const json& value, Type type) {
  switch (type) {
    case Type::integer:
      if (value.is_number_integer()) return value.dump();
      if (value.is_number_float()) {
        const double d = value.get<double>();
        if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 1e15)
          return std::to_string(static_cast<long long>(d));
      }
      return std::nullopt;
    case Type::count_or_auto:
      if (value.is_string() && value.get<std::string>() == "auto") return "auto";
      return as_text(value, Type::integer);
    case Type::count_or_range:
      if (value.is_string() && value.get<std::string>().find(':') != std::string::npos) return value.get<std::string>();
      return as_text(value, Type::integer);
    case Type::number:
      if (value.is_number()) return value.dump();
      return std::nullopt;
    case Type::string:
      if (value.is_string()) return value.get<std::string>();
      return std::nullopt;
    case Type::boolean:
      if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
      return std::nullopt;
  }
  return std::nullopt;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// " (did you mean 'node_rank'?)" for a near miss, else where the keys are listed.
std::string suggestion(std::string_view key) {
  std::string best;
  std::size_t best_distance = 3;  // a typo or two, not another word
  for (const auto& known : accepted_keys()) {
    const auto d = edit_distance(key, known);
    if (d < best_distance) best_distance = d, best = known;
  }
  if (!best.empty()) return fmt::format(" (did you mean '{}'?)", best);
  return " (idist-run --print-config-keys lists them)";
}

std::string read_bounded(const std::string& path, const std::string& named_by) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw UsageError(fmt::format("{}: is a directory", named_by));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(fmt::format("{}: {}", named_by, std::strerror(errno)));
  std::string text(kMaxFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw UsageError(fmt::format("{}: {}", named_by, std::strerror(errno)));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxFileBytes)
    throw UsageError(fmt::format("{}: larger than {} bytes; a launch profile is a few lines", named_by, kMaxFileBytes));
  return text;
}

// nlohmann's "[json.exception.parse_error.101] parse error at line 2, column 19: ...", less the tag.
std::string parse_error_text(const json::parse_error& e) {
  std::string text = e.what();
  if (text.starts_with("[json.exception.")) {
    const auto close = text.find("] ");
    if (close != std::string::npos) text.erase(0, close + 2);
  }
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

std::string File::context(std::string_view key) const { return fmt::format("{}: key '{}'", path, key); }

std::string File::from(std::string_view key) const { return fmt::format("{} in {}", key, path); }

File read_file(const std::string& path, const std::string& named_by) {
  File file;
  file.path = path;
  const std::string text = read_bounded(path, named_by);

  // nlohmann keeps the last of two equal keys; a profile that says two things is an error.
  std::string twice;
  const json::parser_callback_t check = [&, seen = std::set<std::string>()](int depth, json::parse_event_t event,
                                                                            json& parsed) mutable {
    if (event == json::parse_event_t::key && depth == 1 && twice.empty() && !seen.insert(parsed.get<std::string>()).second)
      twice = parsed.get<std::string>();
    if ((event == json::parse_event_t::array_start || event == json::parse_event_t::object_start) && depth >= kMaxDepth)
      throw TooDeep{};
    return true;
  };
  json root;
  try {
    root = json::parse(text, check);
  } catch (const json::parse_error& e) {
    throw UsageError(fmt::format("{}: invalid JSON: {}", path, parse_error_text(e)));
  } catch (const TooDeep&) {
    throw UsageError(fmt::format("{}: arrays or objects nested more than {} deep; a launch profile is one object "
                                 "of settings",
                                 path, kMaxDepth));
  }
  if (!root.is_object())
    throw UsageError(fmt::format("{}: expected a JSON object of settings at the top level, not {}", path, shown(root)));
  if (!twice.empty()) throw UsageError(fmt::format("{}: key '{}' is given twice", path, twice));

  for (const auto& [key, value] : root.items()) {
    if (key == kSchemaKey) continue;
    if (key == kProgramKey) {
      const bool words = value.is_array() && !value.empty() &&
                         std::all_of(value.begin(), value.end(), [](const json& v) { return v.is_string(); });
      if (!words)
        throw UsageError(fmt::format("{}: expected a non-empty array of strings (the program and its arguments), not {}",
                                     file.context(key), shown(value)));
      file.program = value.get<std::vector<std::string>>();
      continue;
    }
    const Setting* setting = find_setting(key);
    if (setting == nullptr) throw UsageError(fmt::format("{}: unknown key '{}'{}", path, key, suggestion(key)));
    if (file.values.contains(setting->key))
      throw UsageError(fmt::format("{}: keys '{}' and '{}' are the same setting; give one", path, setting->key,
                                   dashed(setting->key)));
    auto value_text = as_text(value, setting->type);
    if (!value_text)
      throw UsageError(
          fmt::format("{}: expected {}, not {}", file.context(key), type_words(setting->type), shown(value)));
    file.values.emplace(std::string(setting->key), Value{std::move(*value_text), file.from(key), file.context(key)});
  }
  return file;
}

bool parse_env_flag(std::string_view name, std::string_view value) {
  try {
    return env::parse_flag(name, value);
  } catch (const env::ContractError& e) {
    throw UsageError(e.what());
  }
}

bool no_detect_from_env(const env::Lookup& lookup) {
  const auto value = lookup(kNoDetectEnv);
  return value && parse_env_flag(kNoDetectEnv, *value);
}

namespace {

// torchrun's options that idist-run has too, as torchrun's argparse names them (its `dest`, in
// torch/distributed/run.py): PET_ + the dest in capitals is what torchrun reads when its command
// line does not give the option. Each is one of our keys, and our command line takes torchrun's
// spelling of it (the table's `also` column: "--rdzv_id"; test_config checks both).
// --rdzv_backend's values are torchrun's names, mapped to ours by torchrun_rdzv_backend.
constexpr std::string_view kTorchrunOptions[] = {"nproc_per_node", "nnodes",       "node_rank",     "master_addr",
                                                 "master_port",    "rdzv_backend", "rdzv_id",       "rdzv_endpoint",
                                                 "rdzv_conf",      "max_restarts", "log_dir",       "module",
                                                 "no_python"};

std::string upper(std::string_view text) {
  std::string out(text);
  for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::optional<std::string> torchrun_variable(const Setting& setting) {
  if (std::find(std::begin(kTorchrunOptions), std::end(kTorchrunOptions), setting.key) == std::end(kTorchrunOptions))
    return std::nullopt;
  return "PET_" + upper(setting.key);
}

int torchrun_nproc_per_node(std::string_view text, std::string_view context) {
  if (const auto n = parse_whole<int>(text)) {
    if (*n < 1 || *n > 4096) throw UsageError(fmt::format("{}: {} processes is out of range (1 to 4096)", context, *n));
    return *n;
  }
  const auto gpus = visible_gpus();
  const int cores = std::min(static_cast<int>(usable_cpus().size()), 4096);
  if (text == "cpu") return std::max(1, cores);
  if (text == "gpu") {
    if (gpus.count < 1) throw UsageError(fmt::format("{}: no GPU is visible ({})", context, gpus.why));
    return std::min(gpus.count, 4096);
  }
  if (text == "auto") return std::max(1, gpus.count > 0 ? std::min(gpus.count, 4096) : cores);
  throw UsageError(fmt::format("{}: not a number of processes (1 to 4096), auto, gpu or cpu", context));
}

std::string torchrun_rdzv_backend(std::string_view variable, std::string_view value) {
  // torchrun's static backend is MASTER_ADDR:MASTER_PORT with fixed node ranks, c10d a
  // rendezvous at --rdzv-endpoint that ranks the nodes: idist-run's one rendezvous does both.
  if (value == "c10d" || value == "static") return "c10d";
  // torchrun's etcd-v2 is its etcd backend on etcd's v3 API, as ours is (rendezvous/etcd).
  if (value == "etcd" || value == "etcd-v2") return "etcd";
  throw UsageError(fmt::format("{}='{}' is not a rendezvous backend idist-run knows (c10d or static: the built-in "
                               "rendezvous; etcd or etcd-v2: an etcd cluster)",
                               variable, value));
}

std::string empty_value(std::string_view name, std::string_view wants) {
  // A variable is one word in capitals; anything else (an option, a key) is left out instead.
  const bool variable = !name.empty() && std::isupper(static_cast<unsigned char>(name.front())) &&
                        name.find_first_of(" '") == std::string_view::npos;
  return variable ? fmt::format("{} is set but empty: unset it or give {}", name, wants)
                  : fmt::format("{} is empty: leave it out or give {}", name, wants);
}

void refuse_empty(std::string_view name, std::string_view value, std::string_view wants) {
  if (value.empty()) throw UsageError(empty_value(name, wants));
}

std::string_view wanted(const Setting& setting) {
  static const std::map<std::string_view, std::string_view> kWants = {
      {"rdzv_id", "the job's id"},
      {"rdzv_endpoint", "HOST[:PORT]"},
      {"master_addr", "an address"},
      {"rdzv_backend", "a backend (c10d, static, etcd or etcd-v2)"},
      {"rdzv_conf", "key=value,..."},
      {"log_dir", "a directory"},
      {"port_range", "LO-HI"},
      {"forward_signals", "signal names (or none)"},
      {"nproc_per_node", "a number of processes or auto"},
      {"nnodes", "a number of nodes or MIN:MAX"},
      {"launcher", "a launcher kind (see --help)"},
      {"backend", "a backend (gloo, mpi or nccl)"},
      {"stall_action", "report or kill"},
      {"recovery", "auto or off"},
      {"min_world", "a number of ranks"},
      {"timeout", "a number of seconds"},
      {"grace", "a number of seconds"},
      {"stall_timeout", "a number of seconds"},
      {"heartbeat_timeout", "a number of seconds"},
  };
  const auto it = kWants.find(setting.key);
  return it != kWants.end() ? it->second : type_words(setting.type);
}

namespace {

// 1000000, not 1e+06: a limit reads as the number it is.
std::string seconds_figure(double value) {
  return value == std::floor(value) && std::abs(value) < 1e15 ? fmt::format("{:.0f}", value) : fmt::format("{:g}", value);
}

}  // namespace

double parse_seconds(std::string_view text, SecondsRange range) {
  double value = 0;
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  // from_chars says out of range for 1e999: a number still, only too large (or too small).
  const bool number = !text.empty() && ptr == end && (ec == std::errc() || ec == std::errc::result_out_of_range);
  if (!number || std::isnan(value)) throw UsageError(fmt::format("'{}' is not a number of seconds", text));
  if (ec == std::errc::result_out_of_range) {
    const bool tiny = text.find("e-") != std::string_view::npos || text.find("E-") != std::string_view::npos;
    value = tiny ? 0 : text.front() == '-' ? -HUGE_VAL : HUGE_VAL;
  }
  if (range.min_exclusive ? !(value > range.min) : value < range.min)
    throw UsageError(fmt::format("{} is too small: {} {} s", text, range.min_exclusive ? "above" : "at least",
                                 seconds_figure(range.min)));
  if (value > range.max) throw UsageError(fmt::format("{} is too large: at most {} s", text, seconds_figure(range.max)));
  return value;
}

namespace {

constexpr std::string_view kRdzvConfKeys =
    " (keys: join_timeout, last_call_timeout, heartbeat, node_timeout, in seconds; with etcd also prefix, user, "
    "password, local_addr, protocol, cacert, cert, key)";

// The --rdzv-conf keys of the etcd rendezvous, with what each wants (their values are text).
const std::map<std::string, std::string_view, std::less<>> kEtcdKeys = {
    {"prefix", "a key prefix"},     {"user", "etcd's user name"},      {"password", "the user's password"},
    {"local_addr", "this node's address"}, {"protocol", "http or https"}, {"cacert", "a PEM file"},
    {"cert", "a PEM file"},         {"key", "a PEM file"}};

void set_etcd_key(EtcdRendezvousOptions& etcd, const std::string& key, const std::string& value) {
  if (key == "prefix") etcd.prefix = value.back() == '/' ? value : value + "/";
  else if (key == "user") etcd.user = value;
  else if (key == "password") etcd.password = value;
  else if (key == "cacert") etcd.cacert = value;
  else if (key == "cert") etcd.cert = value;
  else if (key == "key") etcd.key = value;
  else if (key == "local_addr") etcd.local_addr = value;
  else if (value == "https" || value == "http") etcd.https = value == "https";
  else throw UsageError("--rdzv-conf protocol=" + value + ": protocol is http or https");
}

std::chrono::milliseconds* duration_of(RendezvousOptions& r, std::string_view key) {
  if (key == "join_timeout") return &r.join_timeout;
  if (key == "last_call_timeout") return &r.last_call;
  if (key == "heartbeat") return &r.heartbeat;
  if (key == "node_timeout") return &r.dead_after;
  return nullptr;
}

}  // namespace

void parse_rdzv_conf(const std::string& text, RendezvousOptions& r, EtcdRendezvousOptions* etcd) {
  std::size_t at = 0;
  while (at < text.size()) {
    auto end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    at = end + 1;
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const auto bad = [&](const std::string& why) {
      return UsageError("--rdzv-conf '" + item + "': " + why + std::string(kRdzvConfKeys));
    };
    if (eq == std::string::npos) throw bad("not key=value");
    const std::string value = item.substr(eq + 1);
    const std::string name = "--rdzv-conf " + key;
    if (const auto etcd_key = kEtcdKeys.find(key); etcd_key != kEtcdKeys.end()) {
      if (etcd == nullptr) throw bad("'" + key + "' is for --rdzv-backend etcd");
      refuse_empty(name, value, etcd_key->second);
      set_etcd_key(*etcd, key, value);
      continue;
    }
    auto* duration = duration_of(r, key);
    if (duration == nullptr) throw bad("unknown key '" + key + "'");
    refuse_empty(name, value, "a number of seconds");
    double seconds = 0;
    try {
      seconds = parse_seconds(value);
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("--rdzv-conf {}={}", key, e.what()));
    }
    *duration = std::chrono::milliseconds(std::max(1LL, static_cast<long long>(seconds * 1000)));
  }
  if (r.heartbeat >= r.dead_after) throw UsageError("--rdzv-conf: heartbeat must be shorter than node_timeout");
  if (etcd != nullptr && r.dead_after < std::chrono::seconds(2))
    throw UsageError("--rdzv-conf node_timeout: at least 2 seconds with etcd (a lease's TTL is whole seconds, 2 at least)");
}

std::optional<Value> from_env(const Setting& setting, const env::Lookup& lookup) {
  std::string_view name = setting.env;
  auto text = lookup(name);
  // A rank that torchrun (or idist-run) started inherits the PET_* its launcher was given, and
  // has a LOCAL_RANK of its own: they were its launcher's options, not those of an idist-run
  // it runs (which then becomes that rank, detect/torch_env.cpp).
  const auto pet = lookup(env::kLocalRank) ? std::nullopt : torchrun_variable(setting);
  if (text) refuse_empty(name, *text, wanted(setting));
  if (!text && pet) {
    name = *pet;
    text = lookup(name);
    if (text) refuse_empty(name, *text, wanted(setting));
  }
  if (!text) return std::nullopt;
  Value value{*text, std::string(name), fmt::format("{}='{}'", name, *text)};
  if (setting.type == Type::boolean) value.text = parse_env_flag(name, *text) ? "true" : "false";
  // torchrun's -n takes gpu and cpu too; ours takes a count or auto (resolved, and said, later).
  if (pet && name == *pet && setting.key == "nproc_per_node" && (*text == "gpu" || *text == "cpu")) {
    value.text = std::to_string(torchrun_nproc_per_node(*text, value.context));
    value.from = fmt::format("{}={} ({} processes)", name, *text, value.text);
  }
  return value;
}

std::vector<std::string> accepted_keys() {
  std::vector<std::string> keys = {std::string(kProgramKey), std::string(kSchemaKey)};
  for (const auto& setting : kSettings) {
    keys.emplace_back(setting.key);
    if (setting.key.find('_') != std::string_view::npos) keys.push_back(dashed(setting.key));
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::string help_table() {
  std::string out = "Settings: the command line wins over IDIST_* variables, then torchrun's PET_* (for its options:\n"
                    "PET_NNODES, PET_RDZV_ID, ...), then --config FILE.json (IDIST_CONFIG=FILE.json).\n"
                    "Keys take '-' or '_'; flags are true/false in a file, 1/0 in a\n"
                    "variable; \"program\": [\"./train\", \"--epochs\", \"10\"] in a file when none is given here.\n";
  out += fmt::format("  {:<19} {:<23} {}\n", "option", "variable", "config key");
  for (const auto& setting : kSettings) out += fmt::format("  {:<19} {:<23} {}\n", setting.option, setting.env, setting.key);
  out += fmt::format("  {:<19} {:<23} {}", kConfigOption, kConfigEnv, "-");
  return out;
}

std::string effective_table(const std::vector<Resolved>& settings, const std::vector<std::string>& program,
                            std::string_view program_from) {
  std::string out = fmt::format("{:<16} {:<24} {}\n", "setting", "value", "from");
  for (const auto& r : settings) {
    const std::string shown = !r.text ? "(unset)" : r.setting->secret ? std::string(kHidden) : *r.text;
    out += fmt::format("{:<16} {:<24} {}\n", r.setting->key, shown, r.text ? r.from : "-");
  }
  std::string command;
  for (const auto& word : program) command += (command.empty() ? "" : " ") + word;
  out += fmt::format("{:<16} {:<24} {}", kProgramKey, program.empty() ? "(none)" : command,
                     program.empty() ? "" : program_from);
  return out;
}

std::string add_settings(const std::string& plan_json, const std::vector<Resolved>& settings,
                         std::string_view program_from) {
  using ordered = nlohmann::ordered_json;
  auto plan = ordered::parse(plan_json);
  ordered values = ordered::object();
  ordered from = ordered::object();
  for (const auto& r : settings) {
    const std::string key(r.setting->key);
    from[key] = r.from;
    if (!r.text) continue;
    const std::string& text = *r.text;
    ordered value = r.setting->secret ? std::string(kHidden) : text;
    if (r.setting->type == Type::integer || r.setting->type == Type::count_or_auto ||
        r.setting->type == Type::count_or_range) {
      if (auto n = parse_whole<long long>(text)) value = *n;
    } else if (r.setting->type == Type::number) {
      double d = 0;
      const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
      if (ec == std::errc() && ptr == text.data() + text.size()) value = d;
    } else if (r.setting->type == Type::boolean) {
      value = text == "true";
    }
    values[key] = std::move(value);
  }
  from[std::string(kProgramKey)] = program_from;

  // "--nnodes x --nproc-per-node" reads "IDIST_NNODES x nproc_per_node in job.json" when those
  // gave the values: provenance says where each value came from, not which option carries it.
  for (auto& [name, text] : plan["provenance"].items()) {
    std::string s = text.get<std::string>();
    for (const auto& r : settings) {
      if (r.from == r.setting->option || r.from == "default") continue;
      for (auto at = s.find(r.setting->option); at != std::string::npos; at = s.find(r.setting->option, at)) {
        const auto end = at + r.setting->option.size();
        if (end < s.size() && (std::isalnum(static_cast<unsigned char>(s[end])) || s[end] == '-')) {
          at = end;
          continue;
        }
        s.replace(at, r.setting->option.size(), r.from);
        at += r.from.size();
      }
    }
    text = s;
  }
  plan["settings"] = std::move(values);
  plan["settings_from"] = std::move(from);
  return plan.dump(2, ' ', false, ordered::error_handler_t::replace);
}

}  // namespace idist::launchers::config
