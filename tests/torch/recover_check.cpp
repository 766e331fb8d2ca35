// idist::Recovery on bench/ddp's MLP (two W x W layers) with dropout between them, for
// recover.sh and bench/ddp/recovery_time.sh:
//
//   recover_check DIR STEPS [--width W] [--samples N] [--batch B] [--pause-ms M] [--recover]
//                 [--stage-behind R:V:K] [--progress] [--zero-at-end] [--between-ms M] [--print-loss]
//                 [--dropout P] [--replacement-setup-ms M]
//
// Trains STEPS steps (SGD with momentum, a shuffled auto_dataloader, mse against a random
// target), resuming from DIR's newest checkpoint and saving one at the end, so that a run
// stopped at step K and resumed on another world is the reference a recovered run must equal.
// --pause-ms sleeps inside each step, before its forward, so that a kill lands inside a step;
// --between-ms adds a retry() block after each step (a pause, then an all_reduce of the loss,
// as a log line would), so that it lands between steps. --zero-at-end zeroes the gradients
// after the optimizer's step rather than before the backward.
// --stage-behind R:V:K stages a survivor one step behind: at step K, rank R (of the first
// world) waits for the others to commit that step, kills rank V, and raises PeerLostError
// before its own optimizer step, as a rank whose last all_reduce raised while theirs completed.
// --replacement-setup-ms M: a replacement sleeps before its Recovery, as a slow data load would;
// the running ranks train on meanwhile and admit it only after.
//
// Rank 0 prints, after the first step committed since a re-form, "recovered: generation G world W
// after_step S reform_ms=.. reconcile_ms=.. caught_up_bytes=.. raised_ns=R committed_ns=T"
// (rank 0's times; the bytes the rank behind took, if any; R: when rank 0's step last raised
// PeerLostError, 0 if it never did; R and T: CLOCK_REALTIME, for the time from a kill), and at
// the end "recover_check: done steps=N redone=K resumed_from=S seen=M params=P" (P: every
// parameter summed as float64, %.17g).
#include <idist/checkpoint.hpp>
#include <idist/recovery.hpp>
#include <idist/torch.hpp>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

namespace {

struct Mlp : torch::nn::Module {
  Mlp(std::int64_t width, double dropout)
      : fc1(register_module("fc1", torch::nn::Linear(width, width))),
        drop(register_module("drop", torch::nn::Dropout(dropout))),
        fc2(register_module("fc2", torch::nn::Linear(width, width))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(drop(torch::relu(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
};

struct Data : torch::data::datasets::Dataset<Data> {
  torch::Tensor x, y;
  Data(std::int64_t samples, std::int64_t width) {
    auto g = torch::make_generator<at::CPUGeneratorImpl>(11);
    x = torch::randn({samples, width}, g);
    y = torch::randn({samples, width}, g);
  }
  torch::data::Example<> get(std::size_t i) override {
    return {x[static_cast<std::int64_t>(i)], y[static_cast<std::int64_t>(i)]};
  }
  c10::optional<std::size_t> size() const override { return static_cast<std::size_t>(x.size(0)); }
};

struct Config {
  std::string dir;
  std::int64_t steps = 0, width = 256, samples = 1024, batch = 64, pause_ms = 0;
  double dropout = 0.1;
  bool recover = false;
  bool progress = false;  // "step N" on rank 0 after each committed step
  bool zero_at_end = false;  // the step zeroes the gradients after the optimizer, not before
  bool print_loss = false;  // with --between-ms: "loss STEP MEAN" on rank 0, the ranks' mean
  std::int64_t between_ms = -1;  // >= 0: after each step, a retry() block: a pause, an all_reduce of the loss
  std::int64_t replacement_setup_ms = 0;
  std::string stage;      // R:V:K
};

struct Stage {
  int rank = -1, victim = -1;
  std::int64_t step = -1;
  std::vector<std::int64_t> pids;  // of the first world, by rank
};

void log0(const std::string& line) {
  if (idist::get_rank() != 0) return;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

long long realtime_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// At stage.step on stage.rank: the others commit the step meanwhile (they wait in the next one
// for this rank), then the victim dies and this rank raises before its optimizer step.
void stage_behind(Stage& stage, std::int64_t step) {
  if (stage.rank < 0 || step != stage.step || idist::get_rank() != stage.rank) return;
  stage.rank = -1;  // once
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(static_cast<pid_t>(stage.pids[static_cast<std::size_t>(stage.victim)]), SIGKILL);
  std::printf("staged: killed rank %d killed_ns=%lld\n", stage.victim, realtime_ns());
  std::fflush(stdout);
  throw idist::PeerLostError({idist::get_rank(), idist::get_world_size(), "recover_check", idist::backend()},
                             "staged: rank " + std::to_string(stage.victim) + " killed after this step's all_reduce",
                             stage.victim);
}

int train(const Config& config, Stage stage) {
  torch::set_num_threads(1);
  torch::manual_seed(0);
  auto model = idist::auto_model(std::make_shared<Mlp>(config.width, config.dropout));
  auto optimizer = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto loader = idist::auto_dataloader(Data(config.samples, config.width).map(torch::data::transforms::Stack<>()),
                                       {.batch_size = static_cast<std::size_t>(config.batch), .seed = 5});
  std::int64_t step = 0;
  idist::Checkpoint checkpoint({.dir = config.dir, .keep = 1});
  checkpoint.add("model", model).add("optimizer", optimizer).add("loader", loader).add("step", step);
  const auto resumed = checkpoint.load_latest().value_or(0);
  if (!config.stage.empty()) {
    const auto all = idist::all_gather(torch::tensor({static_cast<std::int64_t>(::getpid())}));
    stage.pids.assign(all.data_ptr<std::int64_t>(), all.data_ptr<std::int64_t>() + all.numel());
  }
  std::optional<idist::Recovery> recovery;
  std::int64_t went_on_from = 0;  // the steps committed when the last re-form went on
  std::int64_t caught_up = 0;     // the bytes the rank behind took then
  if (idist::is_replacement()) std::this_thread::sleep_for(std::chrono::milliseconds(config.replacement_setup_ms));
  if (config.recover) {
    recovery.emplace(model, optimizer, loader, idist::RecoveryOptions{.steps = step});
    step = recovery->steps();  // a replacement's: the running ranks' (it joined them)
    // Every rank is here at once, inside the recovery (a collective may be made): the bytes
    // whichever rank was behind took.
    recovery->on_reform([&](const idist::ReformResult&) {
      went_on_from = recovery->steps();
      caught_up = idist::all_reduce(static_cast<std::int64_t>(recovery->last_recovery().caught_up_bytes),
                                    idist::ReduceOp::MAX);
    });
  }
  std::int64_t reported = 0;  // re-forms reported
  long long raised_ns = 0;    // when this rank's last step raised PeerLostError
  std::int64_t seen = 0;
  while (step < config.steps) {
    for (auto& batch : *loader) {
      torch::Tensor loss;
      const auto one_step = [&] {
        try {
          std::this_thread::sleep_for(std::chrono::milliseconds(config.pause_ms));
          if (!config.zero_at_end) optimizer->zero_grad();
          loss = torch::mse_loss(model->forward(batch.data), batch.target);
          loss.backward();
          stage_behind(stage, step + 1);
          optimizer->step();
          if (config.zero_at_end) optimizer->zero_grad();
        } catch (const idist::PeerLostError&) {
          raised_ns = realtime_ns();
          throw;
        }
      };
      if (!recovery) {
        one_step();
        ++step;
        seen += batch.data.size(0);
      } else if (!recovery->step(one_step)) {
        step = recovery->steps();
        if (step >= config.steps) break;
        continue;
      } else {
        step = recovery->steps();
      }
      if (recovery && recovery->reforms() != reported) {  // the first step committed since
        const auto t = recovery->last_recovery();
        char line[300];
        std::snprintf(line, sizeof line,
                      "recovered: generation %lld world %d after_step %lld reform_ms=%.1f reconcile_ms=%.1f "
                      "caught_up_bytes=%lld raised_ns=%lld committed_ns=%lld",
                      static_cast<long long>(recovery->reforms()), idist::get_world_size(),
                      static_cast<long long>(went_on_from), t.reform * 1e3, t.reconcile * 1e3, static_cast<long long>(caught_up),
                      raised_ns, realtime_ns());
        log0(line);
        reported = recovery->reforms();
      }
      if (config.progress) log0("step " + std::to_string(step));
      if (recovery && config.between_ms >= 0) {
        const auto mean = recovery->retry([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(config.between_ms));
          return idist::all_reduce(loss.detach().clone(), idist::ReduceOp::AVG).item<double>();
        });
        if (config.print_loss) log0("loss " + std::to_string(step) + " " + std::to_string(mean));
      }
      if (step == config.steps) break;
    }
  }
  checkpoint.save(step);
  checkpoint.wait();
  double params = 0;
  for (const auto& p : model->parameters()) params += p.to(torch::kDouble).sum().item<double>();
  const auto all_seen = recovery ? recovery->samples() : idist::all_reduce(seen);
  char line[200];
  std::snprintf(line, sizeof line, "recover_check: done steps=%lld redone=%lld resumed_from=%lld seen=%lld params=%.17g",
                static_cast<long long>(step), static_cast<long long>(recovery ? recovery->redone() : 0),
                static_cast<long long>(resumed), static_cast<long long>(all_seen), params);
  log0(line);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  CLI::App app("idist::Recovery on an MLP with dropout (recover.sh)", "recover_check");
  app.add_option("dir", config.dir, "Checkpoints: resumed from, saved at the end")->required();
  app.add_option("steps", config.steps, "Steps in all")->required()->check(CLI::PositiveNumber);
  app.add_option("--width", config.width)->check(CLI::PositiveNumber);
  app.add_option("--samples", config.samples)->check(CLI::PositiveNumber);
  app.add_option("--batch", config.batch, "The global batch")->check(CLI::PositiveNumber);
  app.add_option("--pause-ms", config.pause_ms)->check(CLI::NonNegativeNumber);
  app.add_option("--dropout", config.dropout, "Its probability (0.1)")->check(CLI::Range(0.0, 1.0));
  app.add_flag("--recover", config.recover);
  app.add_flag("--progress", config.progress);
  app.add_flag("--zero-at-end", config.zero_at_end);
  app.add_option("--between-ms", config.between_ms);
  app.add_flag("--print-loss", config.print_loss);
  app.add_option("--stage-behind", config.stage, "R:V:K");
  app.add_option("--replacement-setup-ms", config.replacement_setup_ms)->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  Stage stage;
  long long at = -1;
  if (!config.stage.empty() && std::sscanf(config.stage.c_str(), "%d:%d:%lld", &stage.rank, &stage.victim, &at) != 3) {
    std::fprintf(stderr, "recover_check: --stage-behind %s: expected R:V:K\n", config.stage.c_str());
    return 2;
  }
  stage.step = at;
  try {
    idist::init({.recovery = config.recover});
    const int rc = train(config, stage);
    idist::finalize();
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "recover_check: %s\n", e.what());
    return 1;
  }
}
