"""The `llmtrain` command: launch, config, plan, tune, data prepare, and status / follow / cancel of a run
directory's job."""

from __future__ import annotations

import argparse
import signal
import sys

from llmtrain import __version__
from llmtrain.config.override_help import OVERRIDE_HELP
from llmtrain.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, LlmtrainError


class _Parser(argparse.ArgumentParser):
    """A command's options may come anywhere among its positionals (`launch model=x --dry-run train.max_steps=5`):
    a parser without subcommands of its own parses intermixed. argparse offers that for a parser but refuses it
    for one with subparsers, so the top level dispatches as usual and each command's parser intermixes."""

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        if self._subparsers is not None or self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # parse_known_intermixed_args calls parse_known_args itself (Python < 3.13)
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False

    def error(self, message: str):  # one line, exit 2, like every other bad input
        self.exit(EXIT_USAGE, f"llmtrain: error: {message} (see llmtrain --help)\n")


def _add_compose_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides, e.g. parallel.tp=2")
    p.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                   help="extra config folder searched before the built-in configs/ (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(prog="llmtrain", formatter_class=fmt,
                     description="Config-driven launcher and hybrid-parallel GPT trainer.\n\n"
                                 "  llmtrain launch                          # gpt-tiny on this CPU, no download\n"
                                 "  llmtrain launch model=gpt-125m parallel.tp=2 precision=bf16 device=cuda\n"
                                 "  llmtrain config model=gpt-1.3b           # print the resolved config\n"
                                 "  llmtrain data prepare --input docs/ --output data/train.bin",
                     epilog=OVERRIDE_HELP)
    parser.add_argument("--version", action="version", version=f"llmtrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    launch = sub.add_parser("launch", formatter_class=fmt, epilog=OVERRIDE_HELP,
                            help="compose + validate the config and start torchrun on every node",
                            description="Compose the configs with the overrides, validate them, write the "
                                        "resolved config into run.dir, start torchrun (cluster=local: on this "
                                        "node) and follow the job until it ends; exits with its status.")
    _add_compose_args(launch)
    launch.add_argument("--dry-run", action="store_true",
                        help="print the resolved config, rank layout, commands and environment; start nothing")
    launch.add_argument("-m", "--multirun", action="store_true",
                        help="sweep: one run per combination of the swept values (a,b  range(0,3)  choice(a,b)  "
                             "glob(gpt-*) for a group), each in run.dir/<its swept values, e.g. lr=0.001>; run.dir "
                             "names the sweep directory (default runs/<run.name>-sweep), which holds one sweep")
    launch.add_argument("--fail-fast", action="store_true",
                        help="with -m: stop the sweep at the first failed run (default: report it and go on)")

    config = sub.add_parser("config", formatter_class=fmt, epilog=OVERRIDE_HELP,
                            help="print the resolved config as YAML",
                            description="Compose and validate the config and print it as YAML.")
    _add_compose_args(config)

    doctor = sub.add_parser("doctor", formatter_class=fmt, epilog=OVERRIDE_HELP,
                            help="preflight: hosts reachable, then versions, devices, interfaces, all-reduce "
                                 "bandwidth per node",
                            description="Check that every node can be used (cluster=ssh: each host of the "
                                        "hostfile answers over ssh; cluster=slurm: enough partition nodes are not "
                                        "down, drained or unresponsive) before anything starts, then start a short "
                                        "job on every node (same backend as launch) and report versions, "
                                        "accelerators, the interface and address each node's collectives use, and "
                                        "all-reduce bus bandwidth intra-node, inter-node and over all ranks. "
                                        "Results go to doctor.dir/<YYYYmmdd-HHMMSS>/ (default runs/doctor), never "
                                        "into a run directory; exit 1 on a problem.")
    _add_compose_args(doctor)
    doctor.add_argument("--max-bytes", type=int, default=None,
                        help="largest all-reduce and all-to-all message (default 16 MiB on CPU, 256 MiB on CUDA)")
    doctor.add_argument("--iters", type=int, default=5, help="timed calls per size and collective (default 5)")

    plan = sub.add_parser("plan", formatter_class=fmt, epilog=OVERRIDE_HELP,
                          help="parameters, FLOPs, per-rank memory, bubble, communication, step time; fits or not",
                          description="For the composed config, without launching and without a GPU: parameter "
                                      "count (total, per stage, per rank), FLOPs per token, per-rank memory "
                                      "(weights, gradients, optimizer state by zero level, activations by "
                                      "recompute mode and micro-batches in flight) for the heaviest pipeline "
                                      "stage, pipeline bubble, communication per step, estimated step time, "
                                      "tokens/s and MFU (labelled assumed or calibrated; no MFU without a known "
                                      "peak) for a hardware= profile (configs/hardware/). Exit 1 if it does not "
                                      "fit, naming the smallest layout change that fits.")
    _add_compose_args(plan)
    from llmtrain.plan.cli import add_plan_arguments

    add_plan_arguments(plan)

    tune = sub.add_parser("tune", formatter_class=fmt, epilog=OVERRIDE_HELP,
                          help="measure the plan's fastest layouts in short trials, write the fastest as a config "
                               "and calibrate the plan",
                          description="Take `llmtrain plan`'s K fastest layouts (tp, pp, zero, schedule, "
                                      "micro-batch, recompute) that fit the configured nodes and hardware, keep the "
                                      "global batch, train each for S steps on the configured backend "
                                      "(run.dir/<layout>; run.dir defaults to runs/<run.name>-tune) and print one "
                                      "table: estimated and measured tokens/s, MFU, peak memory, their ratio and "
                                      "whether it fit. The fastest layout is measured again with train.compile "
                                      "and with optim.fused switched (--no-refine skips that). The fastest of all "
                                      "is written as run.dir/best/parallel/tuned.yaml "
                                      "with the `llmtrain launch` line that uses it; the measurements calibrate the "
                                      "plan's step time for this hardware and model family "
                                      "(LLMTRAIN_CACHE/calibration.json). The same command again reuses every "
                                      "recorded trial. Ctrl-C keeps what was measured (exit 130).")
    _add_compose_args(tune)
    from llmtrain.tune.cli import add_tune_arguments

    add_tune_arguments(tune)

    compare = sub.add_parser("compare", help="runs or a sweep side by side: one table sorted by best val loss, "
                                             "one PNG of every loss curve",
                             description="Compare runs (RUN_DIR... or a SWEEP_DIR): one table of the swept keys "
                                         "(or the config keys that differ), final loss, best val loss, tokens/s, "
                                         "MFU and steps, sorted by best val loss; a line when their global batch "
                                         "or tokens seen differ; one PNG of every loss curve. Two runs also get "
                                         "their losses at evenly spaced steps and the largest divergence.")
    from llmtrain.report.compare import add_compare_arguments

    add_compare_arguments(compare)

    report = sub.add_parser("report", help="PNG plots of loss, learning rate, throughput and a summary table",
                            description="Plot a run's loss, learning rate and throughput (PNG) and print a "
                                        "summary table.")
    from llmtrain.report.run_report import add_report_arguments

    add_report_arguments(report)

    _add_job_commands(sub)
    _add_inference_commands(sub)

    data = sub.add_parser("data", help="data tools (prepare)", description="Data tools.")
    data_sub = data.add_subparsers(dest="data_command", metavar="DATA_COMMAND", parser_class=_Parser)
    prepare = data_sub.add_parser("prepare", help="tokenize text files into a token file (nanoGPT .bin)",
                                  description="Tokenize text into a flat token file: byte-level (no download) "
                                              "or with a Hugging Face tokenizer.json. Writes FILE and FILE.json.")
    from llmtrain.data.prepare_cli import add_prepare_arguments

    add_prepare_arguments(prepare)

    ckpt = sub.add_parser("ckpt", help="checkpoint tools (list, export, verify, diff)",
                          description="Checkpoint tools.")
    ckpt_sub = ckpt.add_subparsers(dest="ckpt_command", metavar="CKPT_COMMAND", parser_class=_Parser)
    from llmtrain.checkpoint.export_cli import add_export_arguments
    from llmtrain.checkpoint.list_cli import add_list_arguments

    add_list_arguments(ckpt_sub.add_parser(
        "list", help="checkpoints of a run (a run directory, or a checkpoint location URI): step, complete or not, "
                     "size, layout",
        description="List a run's checkpoints: step, complete or not, size, and the layout they were saved with; "
                    "with a fast tier, which tier holds each. RUN_DIR may be a checkpoint location on an object "
                    "store (s3://bucket/prefix/RUN)."))
    add_export_arguments(ckpt_sub.add_parser(
        "export", help="consolidated weights as safetensors or a Hugging Face folder",
        description="Write a checkpoint's consolidated weights: --format safetensors (llmtrain names) or hf (a "
                    "folder transformers' from_pretrained loads as the model family's class)."))
    from llmtrain.checkpoint.diff_cli import add_diff_arguments
    from llmtrain.checkpoint.verify_cli import add_verify_arguments

    add_verify_arguments(ckpt_sub.add_parser(
        "verify", help="re-read a checkpoint: files against their sizes and CRC32s, chunks, finite tensors",
        description="Re-read a checkpoint (a run directory: its newest; --all: every one): each file against the "
                    "size and CRC32 recorded at save time, DCP's chunks against each tensor's shape, meta.json "
                    "against config.yaml, and every floating tensor (one at a time) for NaN/Inf. Exit 0 with a "
                    "one-line summary, 1 naming the first bad file or tensor, 2 for bad input."))
    add_diff_arguments(ckpt_sub.add_parser(
        "diff", help="compare two checkpoints tensor by tensor, across layouts",
        description="Compare the model and optimizer tensors of two checkpoints (run directories: their newest), "
                    "resharded to full tensors whatever layouts saved them: the first tensor that differs, the "
                    "largest absolute difference, and counts. RNG state and counters are not compared. Exit 0 "
                    "when identical within --atol, 1 when they differ, 2 for bad input."))
    return parser


def _add_job_commands(sub) -> None:
    """status, follow and cancel: the job behind a run directory, from any terminal of the head node."""
    status = sub.add_parser("status", help="the job behind a run directory: state, nodes, step, checkpoint, metrics",
                            description="Show the job behind a run directory: backend, job id, state (running, "
                                        "pending, finished, failed, interrupted, preempted), nodes, step reached "
                                        "of max_steps, newest checkpoint, last metrics row, elapsed training time "
                                        "and the earlier launches. Exit 2 when RUN_DIR is not a run directory.")
    status.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (run.dir)")
    status.add_argument("--json", action="store_true", help="print the same facts as one JSON object")
    follow = sub.add_parser("follow", help="attach to a running job: rank 0's log and progress until it ends",
                            description="Stream rank 0's log and the progress of the job behind RUN_DIR until it "
                                        "ends; exit 0 when it finished, 1 when it failed, 129 when its launcher's "
                                        "terminal closed (SIGHUP), 130 when it was interrupted, 143 when it was "
                                        "preempted. Ctrl-C detaches; the job keeps running.")
    follow.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (run.dir)")
    cancel = sub.add_parser("cancel", help="checkpoint and stop the job behind a run directory (--now: at once)",
                            description="Stop the job behind RUN_DIR. By default it checkpoints first, as on "
                                        "preemption (SIGTERM to its launcher; USR1 to a Slurm job's workers) and "
                                        "this waits until it ended and names the checkpoint; --now stops it at "
                                        "once (scancel for Slurm). Nothing to cancel is not an error (exit 0).")
    cancel.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (run.dir)")
    cancel.add_argument("--now", action="store_true", help="stop at once, without a checkpoint")


def _add_inference_commands(sub) -> None:
    """generate and eval: using a checkpoint in this process (llmtrain.inference)."""
    from llmtrain.inference.eval_cli import add_eval_arguments
    from llmtrain.inference.generate_cli import add_generate_arguments

    add_generate_arguments(sub.add_parser(
        "generate", help="continue a prompt with a checkpoint's model (greedy or sampled)",
        description="Load a checkpoint (a run directory: its newest complete one) in this process, any layout it "
                    "was saved with, and continue --prompt: greedy (--temperature 0) or sampled (temperature, "
                    "top-k, top-p, seed), up to --max-new-tokens or the tokenizer's end-of-text token. Text goes "
                    "through the tokenizer the run's data was prepared with (or --tokenizer). Prints the text; "
                    "what was loaded and the speed go to stderr."))
    add_eval_arguments(sub.add_parser(
        "eval", help="a checkpoint's loss and perplexity on the run's validation data or token files, per source",
        description="Load a checkpoint (a run directory: its newest complete one) in this process and print its "
                    "loss and perplexity (exp(loss)) per source and overall: on the run's validation data (the "
                    "windows the trainer's eval reads, so the loss is its val_loss) or on --data token files."))


def run_inference_command(args) -> int:
    # These start nothing: SIGTERM (or a closed terminal's SIGHUP) ends them like any tool, not as a preemption.
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if args.command == "generate":
        from llmtrain.inference.generate_cli import run_generate

        return run_generate(args)
    from llmtrain.inference.eval_cli import run_eval

    return run_eval(args)


JOB_COMMANDS = ("status", "follow", "cancel")


def run_job_command(args) -> int:
    # These start nothing: SIGTERM (or a closed terminal's SIGHUP) ends them like any tool, not as a launcher's
    # preemption.
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if args.command == "status":
        from llmtrain.jobs.status import run_status

        return run_status(args)
    if args.command == "follow":
        from llmtrain.jobs.follow_job import run_follow

        return run_follow(args)
    from llmtrain.jobs.cancel import run_cancel

    return run_cancel(args)


# Flags of Hydra apps, and what llmtrain offers instead.
HYDRA_FLAGS = {
    "--cfg": "print the resolved config with `llmtrain config [OVERRIDES...]`",
    "-c": "print the resolved config with `llmtrain config [OVERRIDES...]`",
    "--info": "print the resolved config with `llmtrain config [OVERRIDES...]`; the config groups and their "
              "options are listed by `llmtrain --help`",
    "--multirun": "sweeps run with `llmtrain launch -m OVERRIDES...`",
    "-m": "sweeps run with `llmtrain launch -m OVERRIDES...`",
}
# Hydra flags that llmtrain launch takes as its own.
LAUNCH_FLAGS = ("-m", "--multirun")


def hydra_flag_error(argv: list[str]) -> str | None:
    """The message for a Hydra app's flag given to llmtrain, or None."""
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag in HYDRA_FLAGS and not (command == "launch" and flag in LAUNCH_FLAGS):
            from llmtrain.console import error_line

            return error_line(f"{flag} is a flag of Hydra apps; {HYDRA_FLAGS[flag]}")
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    message = hydra_flag_error(argv)
    if message:
        print(message, file=sys.stderr)
        return EXIT_USAGE
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "launch":
            return cmd_launch(args)
        if args.command == "config":
            return cmd_config(args)
        if args.command == "plan":
            from llmtrain.plan.cli import run_plan

            return run_plan(_compose_layout(args), args)
        if args.command == "tune":
            from llmtrain.tune.cli import run_tune

            return run_tune(_compose_layout(args), args)
        if args.command == "report":
            from llmtrain.report.run_report import run_report

            return run_report(args)
        if args.command == "compare":
            from llmtrain.report.compare import run_compare

            return run_compare(args)
        if args.command == "doctor":
            from llmtrain.doctor.command import run_doctor

            return run_doctor(_compose_layout(args), args.max_bytes, args.iters)
        if args.command in JOB_COMMANDS:
            return run_job_command(args)
        if args.command in ("generate", "eval"):
            return run_inference_command(args)
        if args.command == "data" and args.data_command == "prepare":
            from llmtrain.data.prepare_cli import run_prepare

            return run_prepare(args)
        if args.command == "ckpt" and args.ckpt_command == "list":
            from llmtrain.checkpoint.list_cli import run_list

            return run_list(args)
        if args.command == "ckpt" and args.ckpt_command == "verify":
            from llmtrain.checkpoint.verify_cli import run_verify

            return run_verify(args)
        if args.command == "ckpt" and args.ckpt_command == "diff":
            from llmtrain.checkpoint.diff_cli import run_diff

            return run_diff(args)
        if args.command == "ckpt" and args.ckpt_command == "export":
            from llmtrain.checkpoint.export_cli import run_export

            return run_export(args)
        parser.print_help()
        return EXIT_USAGE
    except LlmtrainError as e:  # the one place an error becomes an exit code: the one it carries
        from llmtrain.console import fail

        return fail(e)


def _compose(args, origins: dict[str, str] | None = None):
    from llmtrain.launch.config_probes import compose_here, validate_here

    cfg = compose_here(args.overrides, args.config_dir, origins)
    validate_here(cfg)
    return cfg


def _compose_layout(args):
    """The config of a command that looks at a layout instead of training it (plan, tune, doctor): a default global
    batch that the layout cannot divide is widened, with a line on stderr (stdout may be --json)."""
    from llmtrain.config.batch import widen_default_for_layout
    from llmtrain.console import say
    from llmtrain.launch.config_probes import compose_here, validate_here

    origin: dict[str, str] = {}
    cfg = compose_here(args.overrides, args.config_dir, origin)
    widened = widen_default_for_layout(cfg, origin)
    if widened:
        say(widened, err=True)
    validate_here(cfg)
    return cfg


def cmd_config(args) -> int:
    from llmtrain.config import to_yaml

    sys.stdout.write(to_yaml(_compose(args)))
    return EXIT_OK


def cmd_launch(args) -> int:
    from llmtrain.launch.run import dry_run, launch

    if args.multirun:
        from llmtrain.sweep.launch_sweep import run_sweep

        return run_sweep(args)
    if args.fail_fast:
        from llmtrain.errors import ConfigError

        raise ConfigError("--fail-fast", "stops a sweep at its first failed run: use it with -m")
    origins: dict[str, str] = {}  # where the global batch came from: the launch record and the trainer say it
    cfg = _compose(args, origins)
    if args.dry_run:
        return dry_run(cfg)
    return launch(cfg, origins)


def entry() -> None:
    from llmtrain.closed_stdout import quiet_when_closed

    quiet_when_closed()  # `llmtrain plan | head -1`: no traceback, and the command's own exit code
    # A script's background job (`llmtrain launch ... &`) starts with SIGINT ignored, and Python then installs no
    # handler of its own: Ctrl-C and `llmtrain cancel --now` (two SIGINTs) must reach the launcher all the same.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Until the launcher's handlers are in place (its imports take a moment), SIGTERM / SIGUSR1 / SIGHUP are only
    # noted.
    early: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: early.append(signum))
    try:
        code = _main_with_signals(early)
    except KeyboardInterrupt:
        from llmtrain.launch.supervision.stopping import stopped_early

        # `data prepare` starts no worker; stopped before it began, it has written nothing.
        prepare = sys.argv[1:3] == ["data", "prepare"]
        code = stopped_early("interrupted", EXIT_INTERRUPTED, *(["nothing was written"] if prepare else []))
    sys.exit(code)


def _main_with_signals(early: list[int]) -> int:
    from llmtrain.launch.run import PreemptRequest, raise_preempt
    from llmtrain.launch.supervision.stopping import stopped_early

    # SIGTERM / SIGUSR1 (cluster preemption) and SIGHUP (the terminal closed): checkpoint, then stop. Ctrl-C
    # (SIGINT): stop now. Any of them that arrives before the job has started stops the launch there, without a
    # traceback.
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(sig, raise_preempt)
    try:
        if early:
            raise PreemptRequest(signal.Signals(early[0]).name)
        return main()
    except PreemptRequest as e:
        return stopped_early(str(e), e.exit_code)


if __name__ == "__main__":
    entry()
