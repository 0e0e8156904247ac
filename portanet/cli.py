"""The `portanet` command: devices, train, bench, profile, tune, export."""
import json
import logging
import os
import shlex
import sys
import time

import click

from . import backends, data, files, models, optim, progress, schedules
from . import precision as precisions
from .errors import DivergedError, PortanetError

CLASSES = {"fashion-mnist": 10, "mnist": 10, "coordinates": 1, "shakespeare": None}
TEXTS = ("shakespeare",)        # text corpora: windows of character ids (portanet/text.py)
DEFAULT_LR = {"sgd": 0.02, "adam": 0.001, "adamw": 0.001, "rmsprop": 0.001}


BUCKET_MB = click.option("--bucket-mb", type=float, default=None,
                         help="with --distributed: the megabytes of gradients averaged as one "
                              "all-reduce (default 25, as PyTorch DDP's bucket_cap_mb; 0: each "
                              "layer's alone)")
FIRST_BUCKET_MB = click.option("--first-bucket-mb", type=float, default=None,
                               help="with --distributed: the same for a step's first bucket, "
                                    "which starts while backward goes on (default 1, or "
                                    "0.125 where peer reads sum the small buckets)")


def _buckets(dist, bucket_mb, first_bucket_mb):
    """distributed.init's bucket sizes from the options (only with --distributed)."""
    given = {k: v for k, v in (("bucket_mb", bucket_mb), ("first_bucket_mb", first_bucket_mb))
             if v is not None}
    if given and not dist:
        raise click.UsageError("--bucket-mb and --first-bucket-mb size the averaging of a "
                               "--distributed job")
    return given


@click.group()
@click.version_option(package_name="portanet")
def main():
    """portanet: one layer protocol on CUDA, OpenCL and NumPy."""
    # the library's progress notes (kernel builds that can take minutes) on stderr
    log = logging.getLogger("portanet")
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        log.addHandler(_Stderr())
        log.setLevel(logging.INFO)


class _Stderr(logging.Handler):
    """Log records as plain lines on whatever stderr is when they come."""

    def emit(self, record):
        click.echo(record.getMessage(), err=True)


@main.command()
@click.option("--check", is_flag=True,
              help="build every kernel, run a GEMM and a LeNet training step on each device "
                   "against the NumPy reference; one PASS/FAIL line each, exit 1 on a FAIL")
@click.option("--device", "specs", multiple=True,
              help="with --check: a device string to check; repeat for several "
                   "(default: every device listed)")
def devices(check, specs):
    """List every device the installed backends see, with the string that selects it;
    with --check, check that each builds portanet's kernels and computes what NumPy does."""
    if specs and not check:
        raise click.UsageError("--device selects the devices to --check; "
                               "`portanet devices` alone lists them all")
    if check:
        _check_devices(specs)
        return
    found, missing = backends.list_devices()
    for spec, description in found:
        click.echo(f"{spec:16s} {description}")
    for name, reason in missing:
        click.echo(f"{'(' + name + ')':16s} unavailable: {reason}")


def _check_devices(specs):
    """One line per device as its checks end (a simulator takes a while): the device
    string, its description, PASS or FAIL, build seconds, step milliseconds, GEMM path,
    then on FAIL what failed."""
    from . import check
    targets = check.targets(specs)
    width = max(len(description) for _, description in targets)
    failed = 0
    for spec, description in targets:
        r = check.check_device(spec, description)
        build = "-" if r.build_s is None else f"{r.build_s:.2f} s"
        step = "-" if r.step_ms is None else f"{r.step_ms:.2f} ms"
        line = (f"{r.device:16s} {r.description:{width}s}  {'PASS' if r.passed else 'FAIL'}  "
                f"build {build:>8s}  step {step:>10s}  gemm {r.gemm_path or '-'}"
                + "".join(f"  {name} gemm {error:.1g}"
                          for name, error in r.precision_errors.items()))
        if not r.passed:
            failed += 1
            line += "  " + "; ".join(r.failures)
        click.echo(line)
    if failed:
        click.echo(f"{failed} of {len(targets)} devices failed the check", err=True)
        sys.exit(1)


@main.command()
@click.option("--device", "specs", multiple=True,
              help="a device string to build for; repeat for several (default: every device "
                   "`portanet devices` lists)")
@click.option("--precision", "precision_names", multiple=True,
              help="fp32, tf32, bf16 or fp16; repeat for several (default: every precision "
                   "the device computes)")
@click.option("--model", "model_names", multiple=True,
              help="also train this model (mlp, lenet, resnet, gpt or a description) one "
                   "step at each --batch-size on random images (gpt: token windows of the "
                   "bench's baby GPT): the builds its shapes need; repeat for several")
@click.option("--batch-size", "batch_sizes", type=click.IntRange(1), multiple=True,
              default=(64,), show_default=True,
              help="with --model: a batch size to build for; repeat for several (a "
                   "training's last, smaller batch has shapes of its own)")
def warmup(specs, precision_names, model_names, batch_sizes):
    """Build now what each device would build on first use (kernel families, their 16-bit
    builds, with --model a model's shapes), into the drivers' caches: for a container image
    or each node of a cluster, so that a first training there compiles nothing."""
    from .warmup import warmup as build
    named = bool(specs)
    specs = specs or [spec for spec, _ in backends.list_devices()[0]]
    try:
        for spec in specs:
            if backends.device(spec).kind == "cpu":
                build(spec, say=lambda line: click.echo(line, err=True))
                continue
            for name in precision_names or backends.device(spec).precisions:
                if not named and name not in backends.device(spec).precisions:
                    click.echo(f"{spec}: does not compute in {name}; skipped", err=True)
                    continue
                build(spec, name, model_names, batch_sizes,
                      say=lambda line: click.echo(line, err=True))
    except PortanetError as e:
        raise click.ClickException(str(e)) from e


@main.command()
@click.option("--model", default=None,
              help="mlp, lenet, resnet, gpt, or a description such as "
                   "'conv(8, 3, relu) maxpool(2) flatten dense(10, softmax)' (default: mlp, "
                   "gpt for a text corpus)")
@click.option("--dataset", type=click.Choice(sorted(CLASSES)), default="fashion-mnist",
              show_default=True)
@click.option("--epochs", type=click.IntRange(1), default=5, show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=64, show_default=True)
@click.option("--optimizer", type=click.Choice(sorted(optim.OPTIMIZERS)), default="sgd",
              show_default=True)
@click.option("--lr", type=float, default=None,
              help="learning rate (of the first epoch, under a schedule); default 0.02 for "
                   "sgd, 0.001 for adam, adamw and rmsprop")
@click.option("--schedule", default="constant", show_default=True,
              help="learning rate per epoch, as portanet.schedules: constant, "
                   "'exponential(0.6)', 'step(10, 0.1)', 'cosine(30)', 'warmup(2, cosine(30))'"
                   "; 'cosine' alone spans --epochs")
@click.option("--schedule-unit", type=click.Choice(["epoch", "step"]), default="epoch",
              show_default=True,
              help="what --schedule counts: epochs, or steps (adam and adamw: e.g. "
                   "--schedule 'warmup(100, cosine(4900, 1e-4))' --schedule-unit step)")
@click.option("--momentum", type=float, default=None,
              help="sgd's and rmsprop's momentum (default 0.9 for sgd, 0 for rmsprop)")
@click.option("--nesterov", is_flag=True, help="sgd: Nesterov momentum")
@click.option("--weight-decay", type=float, default=None,
              help="L2 on the weights (adamw: decoupled; default 0, adamw 0.01)")
@click.option("--clip-norm", type=float, default=None,
              help="clip the gradients' global norm to this before each update, e.g. 1.0 "
                   "(default: no clipping)")
@click.option("--device", default=None, help="cpu, opencl, opencl:P, opencl:P:D, cuda, cuda:N "
              "(default: $PORTANET_DEVICE, else cpu)")
@click.option("--precision", default=None,
              help="fp32, tf32, bf16 or fp16: what the matrix products round to (default: "
                   "$PORTANET_PRECISION, else fp32); `portanet devices` lists each device's")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--limit", type=click.IntRange(1), default=None,
              help="train on the first N training samples only (quick runs)")
@click.option("--test-limit", type=click.IntRange(1), default=None,
              help="test on the first N test samples only (quick runs)")
@click.option("--validation-split", type=float, default=0.0, show_default=True,
              help="validate after each epoch on this last fraction of the training set")
@click.option("--save", type=click.Path(dir_okay=False), default=None,
              help="write the trained network to this file (checked before training)")
@click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
              help="save the network and the training state here after each epoch")
@click.option("--resume", type=click.Path(dir_okay=False, exists=True), default=None,
              help="go on from this checkpoint (give the same options as the run that wrote "
                   "it); checkpoints go on being written to it unless --checkpoint says where")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="draw loss and accuracy per epoch to this PNG (needs matplotlib: "
                   "pip install 'portanet[plot]')")
@click.option("--plan", is_flag=True,
              help="print the memory plan of the network at this batch size and exit")
@click.option("--download", is_flag=True, help="download the dataset if it is missing")
@click.option("--context", type=click.IntRange(1), default=None,
              help="a text corpus's window: the tokens a sample holds (default 256)")
@click.option("--sample", type=click.IntRange(0), default=0, show_default=True,
              help="after training a language model, print this many characters it writes")
@click.option("--json", "as_json", is_flag=True, help="end with one JSON line of results")
@click.option("--distributed", "dist", is_flag=True,
              help="data-parallel over the ranks a launcher started (torchrun, srun or "
                   "mpiexec; --batch-size per rank; "
                   "PORTANET_DEVICE may name a device per local rank); rank 0 prints, tests "
                   "and saves")
@click.option("--balance", is_flag=True,
              help="with --distributed: give each rank a share of the global batch "
                   "proportional to its measured step rate")
@BUCKET_MB
@FIRST_BUCKET_MB
def train(model, dataset, epochs, batch_size, optimizer, lr, schedule, schedule_unit, momentum,
          nesterov, weight_decay, clip_norm, device, precision, seed, limit, test_limit,
          validation_split, save, checkpoint, resume, plot_path, plan, download, context, sample,
          as_json, dist, balance, bucket_mb, first_bucket_mb):
    """Train a network and report test accuracy (for a text corpus, the loss and accuracy
    of each next character on its last tenth)."""
    from . import distributed
    text = dataset in TEXTS
    model = (model or ("gpt" if text else "mlp")).strip()
    if model.lower() in ("mlp", "lenet", "resnet", "gpt"):
        model = model.lower()
    language = model == "gpt" or model.lower().startswith("embedding")
    if context is not None and not text:
        raise click.UsageError(f"--context sizes a text corpus's windows; --dataset {dataset} "
                               f"is images")
    context = context or 256
    if text != language:
        raise click.UsageError(f"--dataset {dataset} and --model {model}: a text corpus trains "
                               f"a language model (--model gpt, or a description that starts "
                               f"with embedding), and gpt trains on a text corpus "
                               f"(--dataset {TEXTS[0]})")
    if sample and not text:
        raise click.UsageError("--sample prints what a language model writes: train one on "
                               f"--dataset {TEXTS[0]}")
    if balance and not dist:
        raise click.UsageError("--balance shares the global batch of a --distributed job")
    buckets = _buckets(dist, bucket_mb, first_bucket_mb)
    try:
        group = distributed.init(**buckets) if dist else None
        echo = click.echo if distributed.leader() else (lambda *args, **kwargs: None)
        checkpoint = checkpoint or resume
        check_outputs(("--save", save, "the model"),         # before the training, not
                      ("--checkpoint", checkpoint, "the checkpoints"),      # after it
                      ("--plot", plot_path, "the training curves"))
        opt = make_optimizer(optimizer, lr, momentum, nesterov, weight_decay, clip_norm)
        if schedule_unit == "step" and not opt.rate_on_device:
            raise click.UsageError(f"--schedule-unit step needs --optimizer adam or adamw "
                                   f"(their steps read each one's rate on the device), not "
                                   f"{optimizer}")
        if schedule_unit == "step" and schedule.strip().lower() == "cosine":
            raise click.UsageError("with --schedule-unit step, give cosine its steps, e.g. "
                                   "--schedule 'cosine(5000)'")
        lr_schedule = schedules.parse("cosine({})".format(epochs) if schedule.strip().lower()
                                      == "cosine" else schedule)
        if text:
            (x, y), (x_test, y_test) = data.load_dataset(dataset, download=download,
                                                         context=context)
        else:
            (x, y), (x_test, y_test) = data.load_dataset(dataset, download=download) \
                if dataset != "coordinates" else data.coordinates(seed=seed)
        if limit:
            x, y = x[:limit], y[:limit]
        if test_limit:
            x_test, y_test = x_test[:test_limit], y_test[:test_limit]
        net = build_model(model, dataset, x.shape[1:], device, seed, precision)
        if plan:
            echo(net.memory_plan(min(batch_size, len(x)), opt))
            return
        if balance:
            probe = build_model(model, dataset, x.shape[1:], device, seed, precision)
            try:
                rate = distributed.step_rate(probe, x[:batch_size], y[:batch_size], opt)
            finally:
                probe.free()
            group.balance(rate)
        echo(net.summary(opt), err=True)
        if group:
            echo(f"distributed: {group.size} ranks over {group.engine} on "
                 f"{', '.join(group.devices)}; shares of a global batch "
                 f"{group.shares(batch_size * group.size)}", err=True)
        # a bar on stderr where a person watches it, cleared when an epoch ends; one line
        # per epoch on stdout (progress.py); other ranks say nothing
        shown = progress.Progress(bar=progress.watched(sys.stderr), stream=sys.stderr,
                                  write=click.echo) \
            if distributed.leader() else 0
        history = net.fit(x, y, epochs=epochs, batch_size=batch_size, optimizer=opt,
                          schedule=lr_schedule, schedule_unit=schedule_unit, seed=seed,
                          validation_split=validation_split,
                          checkpoint=checkpoint, resume=resume, verbose=shown)
        if not distributed.leader():
            return              # the others' weights are rank 0's: it tests and saves
        # at the training's batch size (this rank's buffers): its products are the training
        # forward's, whose kernels are built and whose paths are measured already, where a
        # batch size of its own would be a round of builds more on a first use
        test_loss, test_acc = net.evaluate(x_test, y_test,
                                           batch_size=min(batch_size, net.plan.capacity))
        click.echo(f"test loss {test_loss:.4f}  test accuracy {test_acc:.4f}")
        if save:
            net.save(save)
            click.echo(f"saved to {save}", err=True)
        if sample:
            from . import text as corpora
            prompt = corpora.encode(dataset, "\n")
            click.echo(corpora.decode(dataset, net.generate(prompt, sample, seed=seed)))
        if plot_path:
            from . import curves
            curves.plot(history, plot_path, title=f"{model} on {dataset}, {net.backend.name}")
            click.echo(f"curves drawn to {plot_path}", err=True)
        if as_json:
            click.echo(json.dumps({
                "device": net.backend.name, "device_name": net.backend.info()["name"],
                "gemm": net.backend.gemm_path, "precision": net.backend.precision,
                "model": model, "dataset": dataset,
                "epochs": epochs, "batch_size": batch_size, "optimizer": repr(opt),
                "lr": opt.lr, "schedule": repr(lr_schedule), "lrs": history["lr"],
                "seed": seed, "train_samples": len(x), "test_samples": len(x_test),
                "test_accuracy": test_acc,
                "test_loss": test_loss, "final_loss": history["loss"][-1],
                "epoch_seconds": history["seconds"],
                **({"distributed": group.describe()} if group else {}),
                **{k: history[k] for k in ("val_loss", "val_accuracy", "loss_scale",
                                           "skipped_steps") if k in history}}))
    except DivergedError as e:
        raise click.ClickException(
            f"training diverged in epoch {e.epoch + 1}: the loss is {e.loss} at learning "
            f"rate {progress.number(e.lr)}; give a lower --lr (e.g. --lr "
            f"{progress.number(e.lr / 10)}), or a --schedule with warmup such as "
            f"'warmup(2, cosine(30))'"
            + (f"; in fp16 a product's inputs from {precisions.HALF_OVERFLOW:g} up are inf: "
               f"--precision bf16 keeps float32's range" if e.precision == "fp16" else "")
        ) from e
    except PortanetError as e:
        raise click.ClickException(cli_text(e)) from e


def cli_text(error):
    """A PortanetError's message as the command line says it: a fix named by the Python
    argument (batch_size) is named by its option (--batch-size)."""
    text = str(error)
    n = getattr(error, "largest_batch", None)
    if n and text.endswith(f"use batch_size <= {n}"):
        text = text[:-len(f"use batch_size <= {n}")] + f"give --batch-size {n} or less"
    return text


def check_outputs(*outputs):
    """Every file a command writes after its long work (a training, a search, a benchmark)
    checked before that work starts, so that none of it is lost at the end. outputs are
    (option, path or None, what) triples; each path must be a regular file or absent in a
    folder that can be written (files.check_destination), no two options the same file,
    and a --plot needs matplotlib and a format it draws. Raises PortanetError."""
    given = [(option, path, what) for option, path, what in outputs if path]
    seen = {}
    for option, path, what in given:
        try:
            target = os.path.realpath(files.check_destination(path, what))
        except PortanetError as e:      # said in the shell's terms, not Python's
            folder = os.path.dirname(os.path.abspath(path))
            raise type(e)(f"{option}: " + str(e).replace(
                "create it first (os.makedirs)",
                f"create it first (mkdir -p {shlex.quote(folder)})")) from e
        if target in seen:
            raise PortanetError(f"{seen[target]} and {option} name the same file, {path}: "
                                f"one would overwrite the other; give each its own")
        seen[target] = option
        if option == "--plot":
            _check_plot(path)


def _check_plot(path):
    """That a plot can be drawn to path: matplotlib is installed (the `plot` extra) and its
    Agg canvas, which curves.plot and bench.plot draw on, writes the format path's suffix
    names (png where it has none)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as e:
        raise PortanetError(f"--plot needs matplotlib, which cannot be imported here ({e}): "
                            f"pip install 'portanet[plot]', or leave out --plot") from e
    fmt = os.path.splitext(path)[1][1:].lower() or "png"
    supported = FigureCanvasAgg.get_supported_filetypes()
    if fmt not in supported:
        raise PortanetError(f"--plot {path}: matplotlib draws {', '.join(sorted(supported))}, "
                            f"not {fmt!r}; end the name with .png, .svg or .pdf")


# the train command's options that set an optimizer's fields, as its messages name them
OPTIMIZER_FLAGS = {"lr": "--lr", "momentum": "--momentum", "weight_decay": "--weight-decay",
                   "clip_norm": "--clip-norm"}


def make_optimizer(name, lr, momentum, nesterov, weight_decay, clip_norm=None):
    """The optimizer the train command's options describe; a value it refuses is a
    UsageError naming the option (the optimizer's own message names its field)."""
    try:
        return _optimizer(name, lr, momentum, nesterov, weight_decay, clip_norm)
    except optim.SettingError as e:
        if e.field not in OPTIMIZER_FLAGS:
            raise
        raise click.UsageError(f"{OPTIMIZER_FLAGS[e.field]} {e.rule}") from e


def _optimizer(name, lr, momentum, nesterov, weight_decay, clip_norm):
    lr = DEFAULT_LR[name] if lr is None else lr
    extra = {} if weight_decay is None else {"weight_decay": weight_decay}
    if clip_norm is not None:
        extra["clip_norm"] = clip_norm
    if name == "sgd":
        return optim.SGD(lr, 0.9 if momentum is None else momentum, nesterov=nesterov, **extra)
    if nesterov:
        raise click.UsageError("--nesterov is an option of --optimizer sgd")
    if name == "rmsprop":
        return optim.RMSprop(lr, momentum=momentum or 0.0, **extra)
    if momentum is not None:
        raise click.UsageError(f"--momentum is an option of sgd and rmsprop, not {name} "
                               f"(whose betas are 0.9, 0.999)")
    return optim.OPTIMIZERS[name](lr, **extra)


@main.command()
@click.option("--device", "devices", multiple=True,
              help="a device string; repeat for several (default: every device found)")
@click.option("--workload", "workloads", multiple=True,
              help="a workload name; repeat for several (default: all, see --list)")
@click.option("--list", "list_only", is_flag=True, help="list the workloads and exit")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="write every figure and the environment to this file")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="draw time per workload per device to this PNG (needs matplotlib: "
                   "pip install 'portanet[plot]')")
@click.option("--no-torch", is_flag=True, help="skip the PyTorch peer column")
@click.option("--precision", "precisions", multiple=True,
              help="fp32, tf32, bf16 or fp16; repeat for several (default: "
                   "$PORTANET_PRECISION, else fp32). PyTorch's peer rows compute alike (TF32 "
                   "allowed, or autocast to bf16 or fp16)")
@click.option("--distributed", "dist", is_flag=True,
              help="under torchrun, srun or mpiexec: each rank times the training steps on "
                   "its device alone and averaged over the ranks (throughput, scaling "
                   "efficiency), beside PyTorch DDP's where torch and CUDA are here; rank 0 "
                   "prints and writes --json")
@BUCKET_MB
@FIRST_BUCKET_MB
def bench(devices, workloads, list_only, json_path, plot_path, no_torch, precisions, dist,
          bucket_mb, first_bucket_mb):
    """Time the same workloads on every device, beside PyTorch where it is importable."""
    from . import bench as bench_module, distributed
    buckets = _buckets(dist, bucket_mb, first_bucket_mb)
    if dist:
        if devices or plot_path or precisions:
            raise click.UsageError("--distributed takes each rank's device from "
                                   "PORTANET_DEVICE and its precision from "
                                   "PORTANET_PRECISION, and draws no plot")
        try:
            check_outputs(("--json", json_path, "the benchmark report"))
            distributed.init(**buckets)
            report = bench_module.run_distributed(workloads, progress=click.echo,
                                                  peer=not no_torch)
            if json_path and distributed.leader():
                bench_module.write_json(report, json_path)
        except PortanetError as e:
            raise click.ClickException(str(e)) from e
        return
    if list_only:
        for name, (_, description) in bench_module.WORKLOADS.items():
            click.echo(f"{name:12s} {description}")
        return
    try:
        check_outputs(("--json", json_path, "the benchmark report"),   # before the timing
                      ("--plot", plot_path, "the benchmark plot"))
        report = bench_module.run(devices, workloads, peer=not no_torch,
                                  progress=lambda line: click.echo(line, err=True),
                                  precisions=precisions)
        if json_path:
            bench_module.write_json(report, json_path)
        if plot_path:
            bench_module.plot(report, plot_path)
    except PortanetError as e:
        raise click.ClickException(str(e)) from e
    click.echo(bench_module.table(report))
    if not any(r["status"] == "ok" for r in report["results"]):
        raise click.ClickException("nothing ran: every row above failed")


@main.command()
@click.argument("workload", default="lenet-step")
@click.option("--device", default=None, help="an opencl or cuda device string "
              "(default: $PORTANET_DEVICE, else the first OpenCL or CUDA device that is not "
              "a simulator)")
@click.option("--batch-size", type=click.IntRange(1), default=64, show_default=True)
@click.option("--precision", default=None,
              help="fp32, tf32, bf16 or fp16 (default: $PORTANET_PRECISION, else fp32)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="also write the profile to this file")
def profile(workload, device, batch_size, precision, json_path):
    """Time every kernel launch and vendor call of one training step of WORKLOAD
    (mlp-big, mlp-small, lenet-step, resnet-step) and the host time between them."""
    import numpy as np
    from . import bench as bench_module, profiler
    try:
        check_outputs(("--json", json_path, "the profile"))
        bk = backends.device_for(_profiled_device(device), "float32", precision)
        if bk.name == "cpu":
            raise PortanetError(f"cpu cannot be profiled: the NumPy reference has no device "
                                f"queue to time; {_profilable()}")
        net, step = bench_module.training_step(workload, bk, batch_size,
                                               np.random.default_rng(0), eager=True)
        report = profiler.profile(bk, step, warmup_seconds=0.5)
        net.free()
    except PortanetError as e:
        raise click.ClickException(str(e)) from e
    report.update(workload=workload, batch_size=batch_size, precision=bk.precision,
                  date=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    click.echo(f"{workload}, batch {batch_size}, one training step on {report['device']} "
               f"({report['device_name']}, GEMM {report['gemm_path']}, {bk.precision})")
    click.echo(profiler.table(report))
    if json_path:
        bench_module.write_json(report, json_path)


def _profiled_device(device):
    """The device profile runs on: --device, else $PORTANET_DEVICE, else the first OpenCL
    or CUDA device that is not a simulator (said on stderr); a PortanetError listing what
    can be profiled where there is none."""
    from . import config
    if device or config.device_variable():
        return device
    for spec, _ in backends.list_devices()[0]:
        if spec == "cpu":
            continue
        try:
            if backends.device(spec).simulator:
                continue
        except PortanetError:
            continue
        click.echo(f"profiling {spec}, the first device here that can be profiled "
                   f"(--device picks another; `portanet devices` lists them)", err=True)
        return spec
    raise PortanetError(f"no device to profile by default: {_profilable()}")


def _profilable():
    """What to pass to profile a device here: '--device S' for each OpenCL and CUDA device
    listed, or how to install a backend."""
    found, missing = backends.list_devices()
    specs = [spec for spec, _ in found if spec != "cpu"]
    if specs:
        return ("profile an OpenCL or CUDA device: " + ", ".join(f"--device {s}" for s in specs)
                + " (`portanet devices` says what each is; simulators are slow)")
    return ("there is no OpenCL or CUDA device here; pip install 'portanet[opencl]' (with "
            "a driver, or 'portanet[pocl]' for the CPU) or 'portanet[cuda]'")


@main.command()
@click.option("--device", "specs", multiple=True,
              help="a device string; repeat for several (default: $PORTANET_DEVICE, else "
                   "every OpenCL and CUDA device but simulators)")
@click.option("--budget", type=click.IntRange(1), default=None,
              help="most tilings measured per device and size (default 60 on GPUs, 16 on CPUs, "
                   "3 with --quick)")
@click.option("--size", "sizes", type=click.IntRange(1), multiple=True,
              help="m = n = k of a tuning product, a tiling each for outputs of about that "
                   "size; repeat for several (default 1024, 2048 and 4096 on GPUs, 256 on "
                   "CPUs, 67 with --quick)")
@click.option("--quick", is_flag=True,
              help="a tiny search on a small product: checks that tuning works, tunes little")
@click.option("--output", type=click.Path(dir_okay=False), default=None,
              help="merge the results into this file instead of the user's database "
                   "($XDG_CACHE_HOME/portanet/tuning.json)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="also write every measurement to this file")
def tune(specs, budget, sizes, quick, output, json_path):
    """Search the tilings of portanet's GEMM kernel on each device for the fastest
    correct one, measure the vendor GEMM's accuracy over long K (vendor_k), and save both
    where every later run on that device (and driver, and kernel version) picks them up."""
    from . import bench as bench_module, config, tuning
    try:
        database = output or (None if quick else tuning.user_path())
        if database == tuning.user_path():
            database.parent.mkdir(parents=True, exist_ok=True)
        check_outputs(("--output", database, "the GEMM tuning database"),     # before the
                      ("--json", json_path, "the measurements"))          # search, not after
        if database:
            tuning.check_output(database)       # a database of this version, or none
        if not specs:
            specs = [config.device_variable()] if config.device_variable() else [
                spec for spec, _ in backends.list_devices()[0]
                if spec != "cpu" and not backends.device(spec).simulator]
            if not specs:
                raise PortanetError("no OpenCL or CUDA device to tune here (`portanet "
                                    "devices` lists what there is)")
    except OSError as e:
        raise click.ClickException(f"cannot create {database.parent} for the tuning "
                                   f"database: {e.strerror or e}") from e
    except PortanetError as e:
        raise click.ClickException(str(e)) from e
    report = {"schema": "portanet-tune-1", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "environment": bench_module.environment(), "devices": {}}
    failures = []
    for spec in specs:
        try:
            bk = backends.device(spec)
            result = tuning.tune(bk, budget=budget, size=sizes or None, quick=quick,
                                 progress=click.echo)
            # a --quick search is too small to be used by every later run: kept only where
            # asked (--output)
            saved = tuning.save(result, output) if output or not quick else None
        except PortanetError as e:
            failures.append(f"{spec}: {e}")
            report["devices"][spec] = {"error": str(e)}
            if len(specs) > 1:
                click.echo(f"{spec}: {e}", err=True)
            continue
        report["devices"][spec] = result
        click.echo(tuning.summary(result))
        click.echo(f"  saved to {saved}\n" if saved else
                   "  not saved: --quick tunes too little to keep (--output keeps it)\n")
    if json_path:
        bench_module.write_json(report, json_path)
    if failures:
        raise click.ClickException(f"{len(failures)} of {len(specs)} devices not tuned: "
                                   + "; ".join(failures) if len(specs) > 1 else failures[0])


@main.command()
@click.argument("model_file", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--opset", type=int, default=None,
              help="the ONNX opset to write (default 17, 23 for a network with attention)")
def export(model_file, out, opset):
    """Write MODEL_FILE (a file saved by portanet) as the ONNX model OUT (extra `onnx`):
    samples-first input (N, ...) with N free, the output activation included."""
    from . import loading, onnx_export
    try:
        net = loading.load(model_file, device="cpu", precision="fp32")   # computes nothing
        path = onnx_export.to_onnx(net, out, opset)
    except PortanetError as e:
        raise click.ClickException(str(e)) from e
    click.echo(export_report(net, model_file, path, opset or onnx_export.default_opset(net)))


def export_report(net, source, path, opset):
    """A few lines on what export wrote: the file, its opset and size; the network's
    layers by kind, its parameters, its input and output (`print(net)` in Python, or
    `portanet train --plan`, lists every layer)."""
    from .memory import size_text, wrap
    from .plan import flat_size
    kinds = {}
    for layer in net.layers:
        kinds[type(layer).__name__] = kinds.get(type(layer).__name__, 0) + 1
    layers = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
    parameters = sum(flat_size(layer) for _, layer in net.walk())
    last = getattr(net.layers[-1], "activation", None)
    return "\n".join([
        f"wrote {path} (ONNX opset {opset}, {size_text(os.path.getsize(path))}) from {source}",
        *wrap(f"{len(net.layers)} layers: {layers}", "  "),
        f"  {parameters:,d} parameters; input (N, {', '.join(map(str, net.input_shape))}) "
        f"{net.backend.dtype}, output (N, {net.n_out})" + (f" after {last}" if last else "")
        + "; N: any batch"])


def build_model(model, dataset, input_shape, device, seed, precision=None):
    classes = CLASSES[dataset]
    if dataset in TEXTS:
        from . import text
        classes = len(text.characters(dataset))
    where = dict(device=device, seed=seed, precision=precision)
    if model == "mlp" and dataset == "coordinates":
        return models.mlp(input_shape, classes, hidden=(30,), **where)     # the seed's
    return models.build(model, input_shape, classes, **where)


if __name__ == "__main__":
    main()
