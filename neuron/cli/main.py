"""The `neuron` command (also `python -m neuron`)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from .args import (byte_size, count, fuse_kw, fuse_option, layout_option, numeric, path_arg,
                   positive_int, positive_number, precision_option)
from .planning import cmd_profile
from ..memory.policy import POLICIES
from ..units import fmt_bytes, parse_bytes


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every option shows its default: a value, 'off' for flags, or the words its help gives."""

    def _get_help_string(self, action):
        h = action.help or ""
        if "default" in h or not action.option_strings or action.default is argparse.SUPPRESS:
            return h
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return f"{h} (default: {'off' if action.default is False else 'on'})"
        if action.default is None:
            return f"{h} (default: none)"
        return f"{h} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, formatter_class=_Help, **kw):
        super().__init__(*args, formatter_class=formatter_class, **kw)


def _model_args(p, batch_default: int):
    p.add_argument("model", help="model name (see `neuron models`)")
    p.add_argument("--depth", type=positive_int("--depth"), default=None,
                   help="depth for resnet (Table 4 family), resnet_cifar (6n+2), densenet_cifar "
                   "(6n+4) (default: the model's own, required for resnet and resnet_cifar)")
    p.add_argument("--batch", type=positive_int("--batch"), default=batch_default,
                   help="batch size")
    p.add_argument("--classes", type=positive_int("--classes"), default=None,
                   help="number of classes (default: the model's, or the dataset's)")
    _json_arg(p)


def _json_arg(p):
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def _policy_arg(p, default: str | None, default_help: str | None = None):
    p.add_argument("--policy", choices=list(POLICIES), default=default,
                   help="memory policy: baseline (nothing freed early), liveness (free after "
                   "last use), offload (+ LRU offload to host), recompute (+ recomputation), "
                   f"superneurons (all three) (default: {default_help or default})")


def _device_arg(p):
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto",
                   help="auto: cuda when a GPU is usable, else cpu")


def _policy_args(p, default: str, budget_required: bool = False):
    _policy_arg(p, default)
    precision_option(p)
    layout_option(p)
    p.add_argument("--budget", required=budget_required, default=None, type=byte_size("--budget"),
                   help="arena size, e.g. 12GiB, 512MiB, 3GB, 1000000" +
                   ("" if budget_required else " (default: none, i.e. unbounded)"))
    p.add_argument("--offload-params", action="store_true",
                   help="keep parameters and optimizer state on the host between uses")
    _resident_params_arg(p)
    p.add_argument("--recompute-strategy", choices=["speed", "memory", "cost"], default="cost",
                   help="which segments recomputation drops: speed-centric, memory-centric, "
                   "or chosen by cost")
    p.add_argument("--no-compact", action="store_true",
                   help="never slide tensors together when free bytes are scattered (the "
                   "paper's pool); fragmentation can then fail a plan that has the bytes")
    p.add_argument("--no-tensor-cache", action="store_true",
                   help="offload every activation backward needs right after its last forward "
                   "use (vDNN-style) instead of only when the arena is short")
    p.add_argument("--chunks", default="1", type=positive_int("--chunks", words=("auto",)),
                   help="split every layer's step along the batch into N chunks, or 'auto': "
                   "the smallest count that fits the budget (default 1)")
    _prefetch_ahead_arg(p)
    fuse_option(p)
    p.add_argument("--host-budget", default=None, type=byte_size("--host-budget"),
                   help="host memory for offloaded tensors (default: unlimited for plan, "
                   "128GiB for deepest/widest)")


def _prefetch_ahead_arg(p):
    p.add_argument("--prefetch-ahead", default="1", metavar="N|auto",
                   type=positive_int("--prefetch-ahead", words=("auto",)),
                   help="how many steps ahead tensors on the host are brought back: up to N "
                   "steps, as far as the arena's free bytes allow without any step before the "
                   "reader having to evict; 'auto': as far as that and the planning cost model's "
                   "copy and step times need (default 1: the next step's reads; "
                   "docs/memory.md)")


def _resident_params_arg(p):
    p.add_argument("--resident-params", default=None, type=byte_size("--resident-params"),
                   metavar="SIZE",
                   help="with --offload-params: this many bytes of parameter blocks (the last "
                   "layers' first) stay in the arena instead, moving nothing (default: none; "
                   "docs/memory.md)")


def resident_params_kw(args) -> dict:
    """The Executor's resident_params, where given (it needs --offload-params)."""
    n = getattr(args, "resident_params", None)
    if n is None:
        return {}
    if not args.offload_params:
        raise SystemExit(f"neuron {args.command}: error: --resident-params needs "
                         "--offload-params")
    return {"resident_params": n}


def _positive(name):
    """An integer >= 1 (kept for the modules that import it from here)."""
    return positive_int(name)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="neuron", description="neuron: train very deep and wide networks on a "
                 "memory budget; plan them without a GPU.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")  # _Parser too

    t = sub.add_parser("train", help="train a model", description="Train MODEL on a dataset "
                       "and report loss, accuracy, speed and memory. SIGINT/SIGTERM/SIGHUP stop "
                       "after the current step and write --checkpoint.")
    _model_args(t, 64)
    precision_option(t)
    layout_option(t)
    g = t.add_mutually_exclusive_group()
    g.add_argument("--iters", type=positive_int("--iters"),
                   help="number of iterations (default: one epoch)")
    g.add_argument("--epochs", type=positive_number("--epochs"),
                   help="number of epochs (default: 1)")
    t.add_argument("--dataset", default="synthetic",
                   help="synthetic | digits | cifar10:DIR | mnist:DIR | folder:DIR")
    t.add_argument("--lr", type=positive_number("--lr"), default=0.1,
                   help="base learning rate")
    t.add_argument("--momentum", type=numeric("--momentum", low=0, high=1, high_open=True),
                   default=0.9, help="SGD momentum")
    t.add_argument("--weight-decay", type=numeric("--weight-decay", low=0), default=5e-4,
                   help="L2 weight decay")
    t.add_argument("--nesterov", action="store_true", help="Nesterov momentum")
    t.add_argument("--schedule", choices=["cosine", "constant"], default="cosine",
                   help="learning-rate schedule over the run")
    t.add_argument("--warmup", type=count("--warmup"), default=0,
                   help="linear warm-up iterations")
    t.add_argument("--seed", type=count("--seed"), default=0,
                   help="seed of the initialization and the data order")
    _device_arg(t)
    _policy_arg(t, None, "liveness; superneurons, planned, under --budget")
    t.add_argument("--budget", default=None, type=byte_size("--budget"),
                   help="arena size, e.g. 12GiB, 512MiB, 3GB (default: the planned peak)")
    t.add_argument("--offload-params", action="store_true",
                   help="keep parameters and optimizer state on the host between uses")
    _resident_params_arg(t)
    t.add_argument("--chunks", default="1", type=positive_int("--chunks", words=("auto",)),
                   help="split every layer's step along the batch into N chunks, or 'auto' "
                   "(needs --budget): the smallest count that fits (default 1)")
    _prefetch_ahead_arg(t)
    fuse_option(t)
    t.add_argument("--checkpoint", default=None, metavar="FILE.npz",
                   type=path_arg("--checkpoint"),
                   help="write parameters + optimizer state here, atomically, every "
                   "--checkpoint-every iterations and at the end (default: the --resume file, "
                   "else none)")
    t.add_argument("--checkpoint-every", type=positive_int("--checkpoint-every"), default=None,
                   metavar="N", help="iterations between checkpoints (default: one epoch)")
    t.add_argument("--resume", default=None, metavar="FILE.npz", type=path_arg("--resume"),
                   help="resume from a checkpoint written by --checkpoint (default: none)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--replay", choices=["off", "tape", "graph"], default=None,
                   help="off: the executor runs every iteration; tape: the planned iteration is "
                   "recorded once and its device operations replayed (the bits of off); graph: "
                   "the tape as one CUDA graph (default: tape on the CPU, graph on a GPU)")
    # folder:DIR (ImageFolder layout, decoded by Pillow in background threads)
    t.add_argument("--loader-workers", type=positive_int("--loader-workers"), default=None,
                   help="folder:DIR: threads decoding images (default: the cores, at most 8)")
    t.add_argument("--on-corrupt", choices=["skip", "refuse"], default="skip",
                   help="folder:DIR: leave unreadable images out and count them, or stop at "
                   "the first (default skip)")
    from ..distributed.launch import add_plan_arguments, add_train_arguments
    add_train_arguments(t)

    s = sub.add_parser("summary", help="layers, shapes, parameters and per-step bytes",
                       description="List MODEL's layers, output shapes, parameter counts and the "
                       "bytes each forward and backward step needs resident.")
    _model_args(s, 32)
    s.add_argument("--all", action="store_true", help="print every layer (default: off, the "
                   "first and last 20 for deep models)")

    pl = sub.add_parser("plan", help="plan an iteration without a GPU: peak, minimum budget, "
                        "lower bound, per-step trace",
                        description="Run the executor's own scheduling on a virtual device (no "
                        "data, no kernels) and report peak bytes, the smallest arena the policy "
                        "completes in, the layer-granularity lower bound, bytes by kind at the "
                        "peak, the per-step trace, recomputations and bytes moved.")
    _model_args(pl, 32)
    _policy_args(pl, "superneurons")
    pl.add_argument("--plot", default=None, metavar="FILE.png",
                    help="draw bytes in use per step against the budget, the forward/backward "
                    "boundary, recomputations, compactions and bytes moved to and from the host; "
                    "with --time, memory and streams against time (needs matplotlib: pip install "
                    "'neuron-arena[plot]', or pip install -e '.[plot]' in a checkout) (default: "
                    "none)")
    pl.add_argument("--html", default=None, metavar="FILE.html",
                    help="write an interactive timeline of every tensor's stay in the arena "
                    "(address against step; hover for name, bytes, steps): one self-contained "
                    "file, no network (default: none)")
    pl.add_argument("--no-min-budget", action="store_true",
                    help="skip the minimum-budget search (faster)")
    add_plan_arguments(pl)

    dp = sub.add_parser("deepest", help="deepest network of a family that fits a budget",
                        description="Exponential then bisection search, by planning, for the "
                        "deepest MODEL (resnet: SuperNeurons Table 4 family; resnet_cifar: 6n+2; "
                        "densenet_cifar: 6n+4) whose training iteration fits --budget.")
    dp.add_argument("model", help="model family: resnet, resnet_cifar or densenet_cifar")
    dp.add_argument("--batch", type=positive_int("--batch"), default=16, help="batch size")
    _json_arg(dp)
    dp.add_argument("--confirm", action="store_true",
                    help="run real training iterations at the answer (CPU or GPU)")
    _device_arg(dp)
    _policy_args(dp, "superneurons", budget_required=True)

    wd = sub.add_parser("widest", help="largest batch that fits a budget",
                        description="Exponential then bisection search, by planning, for the "
                        "largest batch of MODEL whose training iteration fits --budget.")
    wd.add_argument("model", help="model name (see `neuron models`)")
    wd.add_argument("--depth", type=positive_int("--depth"), default=None,
                    help="depth, for the models that take one (default: the model's own)")
    _json_arg(wd)
    wd.add_argument("--confirm", action="store_true",
                    help="run real training iterations at the answer (CPU or GPU)")
    _device_arg(wd)
    _policy_args(wd, "superneurons", budget_required=True)

    # time and planners (issue 12): cli/planning.py
    from .planning import add_planner_arg, add_profile_command, add_time_args
    add_time_args(pl)
    add_profile_command(sub, _positive)
    for cmd in (pl, dp, wd, t):
        add_planner_arg(cmd, default_under_budget=cmd in (pl, t))
    mem = sub.add_parser("memory", help="where an iteration's bytes go: peak by kind, the "
                         "tensors and steps that make it, fragmentation, bytes moved",
                         description="Record one planned iteration (the simulation `neuron plan` "
                         "runs) and report, like torch.cuda.memory_summary(): bytes by kind at "
                         "the peak, the largest tensors and fullest steps, fragmentation (largest "
                         "free block against free bytes), compactions, bytes moved each way.")
    _model_args(mem, 32)
    _policy_args(mem, "superneurons")
    mem.add_argument("--top", type=positive_int("--top"), default=10,
                     help="how many tensors and steps to list (default 10)")
    add_planner_arg(mem, default_under_budget=True)

    m = sub.add_parser("models", help="list the model names")
    _json_arg(m)
    return ap


COMMANDS = {}       # name -> function(args) -> exit code; filled below


def console_main() -> int:
    """The `neuron` console script and `python -m neuron`: the process ends with the command."""
    return main(exiting=True)


def main(argv=None, exiting: bool = False) -> int:
    """Exit codes: 0 done, 1 a runtime failure, 2 a usage error, 128+N stopped by signal N.
    Every failure is one line on stderr (NEURON_TRACEBACK=1 shows the traceback)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    from .errors import run_command
    from .planning import resolve_planner

    def command(args):
        if getattr(args, "device", None) == "cuda":     # before anything imports CuPy
            from ..devices.cuda_check import require_cuda
            require_cuda()          # one line naming every missing piece
        resolve_planner(args, args.command)     # a usage error is reported like the others
        return COMMANDS[args.command](args)
    return run_command(args.command, command, args, exiting=exiting)


def _build(args, in_shape=None, num_classes=None):
    from ..executor import no_gc
    from ..models import build_model
    with no_gc():       # 10^4-layer graphs: nothing cyclic to collect while building
        return build_model(args.model, depth=args.depth, in_shape=in_shape,
                           num_classes=num_classes or args.classes)


def cmd_models(args) -> int:
    from ..models import model_names
    names = model_names()
    if args.json:
        print(json.dumps({"models": names}))
    else:
        print("\n".join(names))
    return 0


def cmd_summary(args) -> int:
    from ..views.summary import summarize
    info = summarize(_build(args), args.batch)
    if not args.json or args.all:
        rows = info["layers"]
        show = rows if args.all or len(rows) <= 60 else rows[:20] + [None] + rows[-20:]
        print(f"{'layer':32} {'type':28} {'output':22} {'params':>11} {'fwd':>11} {'bwd':>11}")
        for r in show:
            if r is None:
                print(f"... {len(rows) - 40} more layers ...")
                continue
            print(f"{r['name'][:32]:32} {r['describe'][:28]:28} {str(tuple(r['output_shape']))[:22]:22}"
                  f" {r['params']:>11,} {fmt_bytes(r['fwd_bytes']):>11} {fmt_bytes(r['bwd_bytes']):>11}")
        print(f"{info['model']}: {info['num_layers']} layers, {info['params']:,} parameters "
              f"({fmt_bytes(info['param_bytes'])}), largest step {fmt_bytes(info['max_step_resident_bytes'])}"
              f" at batch {args.batch} (its tensors, parameters included, and workspace)")
    if args.json:
        print(json.dumps(info))
    return 0


def _policy_kw(args, host_default=None) -> dict:
    from ..memory.planners import get_planner
    from ..memory.policy import get_policy
    get_policy(args.policy)                      # unknown policy: error before any work
    if args.planner:
        get_planner(args.planner)                # unknown planner: the error lists the names
    hb = args.host_budget or host_default
    from .planning import planner_spec
    return dict(policy=args.policy, planner=planner_spec(args), offload_params=args.offload_params,
                **resident_params_kw(args),
                precision=args.precision, layout=args.layout,
                recompute_strategy=args.recompute_strategy,
                tensor_cache=not args.no_tensor_cache,
                compact=False if args.no_compact else None, chunks=args.chunks,
                host_budget=parse_bytes(hb) if hb else None,
                prefetch_ahead=args.prefetch_ahead, **fuse_kw(args))


def cmd_plan(args) -> int:
    from ..plan import make_plan
    if args.plot:                   # a missing matplotlib is an error now, not after the plan
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ImportError("--plot needs matplotlib: pip install 'neuron-arena[plot]' (in a "
                              "checkout: pip install -e '.[plot]')") from None
    budget = parse_bytes(args.budget) if args.budget else None
    graph = _build(args)
    from .planning import cost_model, print_time
    from ..distributed.launch import plan_allreduce, plan_comm_model, plan_grad_buckets, plan_lag
    cost = cost_model(args) if args.time or args.planner else None
    lag, lag_search = plan_lag(args, graph, budget, cost, **_policy_kw(args))
    # a planner plans with the cost model; the iteration is timed (and drawn against time)
    # only with --time
    planned = make_plan(graph, args.batch, budget=budget, search_min=not args.no_min_budget,
                        model=args.model, cost=cost, timed=args.time,
                        comm=plan_comm_model(args), grad_buckets=plan_grad_buckets(args),
                        grad_lag=lag, **_policy_kw(args))
    r = planned.report
    plan_allreduce(args, graph, r)
    if lag_search is not None:
        r["dp_lag"], r["dp_lag_search"] = lag, lag_search
        print(f"--dp-lag auto: {lag} backward steps (tried "
              + ", ".join(f"{t['lag']}: " + (f"{t['simulated_time_s'] * 1e3:.3f} ms"
                                             if t["fits"] else "does not fit")
                          for t in lag_search) + "); train with --dp-lag " + str(lag))
    mb = r["min_budget_bytes"]
    how = f"planner {r['planner']}" if r.get("planner") else f"policy {r['policy']}"
    print(f"{args.model} batch {args.batch}, {how}"
          f"{' + offload-params' if args.offload_params else ''}"
          f"{', precision ' + args.precision if args.precision != 'fp32' else ''}"
          f"{', layout ' + args.layout if args.layout != 'nchw' else ''}: "
          f"{r['num_layers']} layers, "
          f"{r['num_steps']} steps, {r['params']:,} parameters")
    print(f"  peak (unbounded arena)  {fmt_bytes(r['unbounded_peak_bytes'])}  (the plan for no "
          "budget)")
    if mb is not None:
        print(f"  minimum budget          {fmt_bytes(mb)}  (the smallest arena the plan for no "
              f"budget completes in: {mb / r['lower_bound_bytes']:.3f} x neuron's bound, "
              f"{mb / r['ideal_bound_bytes']:.3f} x ideal bound)")
    print(f"  neuron's layer bound    {fmt_bytes(r['lower_bound_bytes'])}  (largest step "
          f"{fmt_bytes(r['max_step_bytes'])} with its preferred workspace + resident state)")
    print(f"  ideal layer bound       {fmt_bytes(r['ideal_bound_bytes'])}  (largest step "
          f"{fmt_bytes(r['ideal_max_step_bytes'])}: the layer's inputs, outputs, gradients, "
          "parameters; no workspace)")
    print(f"  extra forward steps     {r['extra_forward_steps']}")
    if r["chunks"] > 1:
        off = "; the policy's recomputation is off with chunks" \
            if r.get("recompute_off_for_chunks") else \
            f"; {r['planner']} plans each chunk's tensors" if r.get("planner") else ""
        print(f"  chunks                  {r['chunks']} per layer (batch split into "
              f"{r['chunks']} parts{off})")
    if budget is not None:
        if r["fits"]:
            print(f"  budget {fmt_bytes(budget)}: fits, peak {fmt_bytes(r['peak_bytes'])}, "
                  f"offloaded {fmt_bytes(r['offload_bytes'])}, brought back "
                  f"{fmt_bytes(r['prefetch_bytes'])}, host peak "
                  f"{fmt_bytes(r['host_peak_bytes'] or 0)}, {r['num_steps']} steps")
        else:
            need = f"; the minimum budget is {mb} bytes ({fmt_bytes(mb)})" if mb else ""
            print(f"  budget {fmt_bytes(budget)}: does NOT fit: {r['error']}{need}")
    if r.get("fuse"):
        names = [first for first, _ in r["fused_layers"]]
        shown = ", ".join(names[:6]) + (f", ... ({len(names) - 6} more)" if len(names) > 6 else "")
        print(f"  fused (--fuse)          {_fused_pairs_text(r['fused_counts'])}"
              f"{': ' + shown if names else ''}")
        print(f"                          {fmt_bytes(r['fused_tensor_bytes'])} of tensors no "
              f"longer exist (the BN and Add outputs and their gradients); unbounded peak "
              f"{fmt_bytes(r['unfused_unbounded_peak_bytes'])} unfused, saved "
              f"{fmt_bytes(r['fuse_saved_peak_bytes'])}")
    if "data_parallel" in r:
        d = r["data_parallel"]
        print(f"  all-reduce (ring, {d['world_size']} ranks, {d['link_gbps']:g} Gbit/s)  "
              f"{fmt_bytes(d['allreduce_bytes'])} in {d['allreduce_calls']} calls: "
              f"{d['allreduce_time_s'] * 1e3:.3f} ms per iteration")
    if args.time:
        print_time(r)
    if r.get("bytes_by_kind"):
        kinds = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in r["bytes_by_kind"].items() if v)
        print(f"  at the peak: {kinds}")
    if r.get("bytes_by_dtype"):
        types = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in sorted(
            r["bytes_by_dtype"].items(), key=lambda kv: -kv[1]))
        print(f"  at the peak by type ({r['precision']}): {types} (workspaces apart)")
    print("  all tensors by type     " + "; ".join(
        f"{d} {fmt_bytes(sum(k.values()))} (" + ", ".join(
            f"{kind} {fmt_bytes(b)}" for kind, b in k.items()) + ")"
        for d, k in r["tensor_bytes_by_dtype"].items()))
    timeline = r.pop("timeline", None)
    if (args.plot or args.html) and r["fits"]:
        _draw_plan(args, planned, timeline)
    elif args.plot or args.html:
        print(f"  {' and '.join(f for f in ('--plot', '--html') if getattr(args, f[2:]))}: "
              "nothing drawn, the iteration does not fit the budget")
    if args.json:
        print(json.dumps(r))
    return 0 if r["fits"] else 1


def _fused_pairs_text(counts: dict) -> str:
    """"4 BatchNorm+ReLU pairs as BNReLU and 3 Add+ReLU pairs as AddReLU layers": what --fuse
    made of the model (neuron/fuse.py fused_counts)."""
    parts = [f"{counts.get(t, 0)} {pair}+ReLU pairs as {t}" for pair, t in
             (("BatchNorm", "BNReLU"), ("Add", "AddReLU"))]
    return " and ".join(parts) + " layers"


def cmd_memory(args) -> int:
    from ..views.memory_summary import format_summary, memory_summary
    r = memory_summary(_build(args), args.batch, model=args.model, top=args.top,
                       budget=parse_bytes(args.budget) if args.budget else None,
                       **_policy_kw(args))
    print(format_summary(r))
    if args.json:
        print(json.dumps(r))
    return 0 if r["fits"] else 1


def _draw_plan(args, planned, timeline) -> None:
    """--plot / --html: replay the plan with a log of every event (the same plan and
    simulation as the report) and draw it; --plot with --time: against simulated time."""
    r, budget = planned.report, planned.budget
    rec = planned.record()[0] if args.html or (args.plot and not args.time) else None
    how = f"planner {r['planner']}" if r.get("planner") else f"policy {r['policy']}"
    title = (f"{args.model} batch {args.batch}, {how}"
             f"{' + offload-params' if args.offload_params else ''}")
    if args.plot and args.time:
        from ..memory.clock_plot import plot_timeline
        plot_timeline(timeline, r["steps"], args.plot, title=title, budget=budget,
                      min_budget=r["min_budget_bytes"])
        print(f"  memory and streams against simulated time drawn to {args.plot}")
    elif args.plot:
        from ..views.report import plot_recording
        plot_recording(rec, args.plot, title=title, budget=budget,
                       min_budget=r["min_budget_bytes"])
        print(f"  memory per step drawn to {args.plot}")
    if args.html:
        from ..views.timeline_html import write_timeline
        write_timeline(rec, args.html, title=title, budget=budget)
        print(f"  timeline of every tensor written to {args.html}")


def _search_cmd(args, kind: str) -> int:
    from .. import plan as P
    budget = parse_bytes(args.budget)
    kw = _policy_kw(args, host_default="128GiB")
    from tqdm import tqdm
    bar = tqdm(desc=f"{kind} {args.model}", unit="probe", disable=args.json, leave=False)

    def progress(v, ok):
        bar.set_postfix_str(f"{'batch' if kind == 'widest' else 'depth'} {v}: "
                            f"{'fits' if ok else 'does not fit'}")
        bar.update(1)

    try:                # closed on Ctrl-C too, so the error line starts a line of its own
        if kind == "deepest":
            r = P.deepest(args.model, args.batch, budget, progress=progress, **kw)
            key, label = "deepest", "depth"
        else:
            r = P.widest(args.model, budget, depth=args.depth, progress=progress, **kw)
            key, label = "widest", "batch"
    finally:
        bar.close()
    print(f"| {label} | fits | seconds |\n|---|---|---|")
    for p in r["probes"]:
        print(f"| {p[label]} | {'yes' if p['fits'] else 'no'} | {p['seconds']} |")
    ans = r[key]
    chunked = f", {r['chunks']} chunks" if r.get("chunks") not in (None, 1) else ""
    print(f"{kind} {args.model} under {fmt_bytes(budget)} "
          f"({'planner ' + r['planner'] if r.get('planner') else r['policy']}"
          f"{', offload-params' if r['offload_params'] else ''}"
          f"{', precision ' + r['precision'] if r['precision'] != 'fp32' else ''}"
          f"{', layout ' + r['layout'] if r.get('layout', 'nchw') != 'nchw' else ''}"
          f"{', BatchNorm+ReLU and Add+ReLU fused' if r.get('fuse') else ''}): "
          f"{ans if ans is not None else 'nothing fits'}{chunked}")
    if args.confirm and ans is not None:
        r["confirm"] = _confirm(args, kind, ans, budget, kw)
        print(f"confirmed with {r['confirm']['iterations']} real iterations on "
              f"{r['confirm']['device']}: loss {r['confirm']['final_loss']:.4f}, pool peak "
              f"{fmt_bytes(r['confirm']['peak_bytes'])}")
    if args.json:
        print(json.dumps(r))
    return 0


def _confirm(args, kind, ans, budget, kw) -> dict:
    import numpy as np
    from ..executor import Executor
    from ..models import build_model
    depth = ans if kind == "deepest" else args.depth
    batch = args.batch if kind == "deepest" else ans
    graph = build_model(args.model, depth=depth)
    if kw.get("chunks") == "auto":
        from ..plan import choose_chunks
        kw = {**kw, "chunks": choose_chunks(graph, batch, budget,
                                            **{k: v for k, v in kw.items() if k != "chunks"})}
    ex = Executor(graph, batch, device=args.device, budget=budget, **kw)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *graph.inputs[0].shape)).astype(np.float32)
    y = rng.integers(0, graph.outputs[0].shape[0], batch)
    losses = [ex.train_step(x, y) for _ in range(2)]
    return {"iterations": 2, "final_loss": losses[-1], "peak_bytes": ex.pool.high_water,
            "device": ex.device.name}


def cmd_deepest(args) -> int:
    return _search_cmd(args, "deepest")


def cmd_widest(args) -> int:
    return _search_cmd(args, "widest")


def _replay_text(r: dict) -> str:
    if r["mode"] == "off":
        return ", replay off"
    if r["eager_because"]:
        return f", replay {r['mode']} not used: {r['eager_because']}"
    return (f", replayed {r['replayed_iterations']} of "
            f"{r['replayed_iterations'] + r['recorded_iterations']} iterations from a {r['mode']} "
            f"of {r['operations'] or 0} operations")


def cmd_train(args) -> int:
    from ..data import load_dataset
    from ..errors import MemoryBudgetError
    from ..fuse import fused_counts
    from ..executor import Executor
    from ..optim import SGD
    from ..train import fit
    from ..checkpoint import check_checkpoint_target
    from ..distributed.launch import (grad_lag, make_train_comm, stop_all_ranks_on_error,
                                     train_grad_buckets)
    from ..errors import UsageError
    started = time.perf_counter()
    grad_buckets, lag = train_grad_buckets(args), grad_lag(args)
    comm = make_train_comm(args)        # before the device: a GPU rank picks its GPU first
    from .planning import planner_spec
    budget = parse_bytes(args.budget) if args.budget else None
    if args.checkpoint is None and args.resume:     # a resumed run goes on saving where it was
        args.checkpoint = args.resume
    if args.checkpoint is not None:     # a bad target costs nothing yet
        check_checkpoint_target(args.checkpoint)
    split = load_dataset(args.dataset, seed=args.seed,
                         num_classes=args.classes or 10,
                         sample_shape=_build(args).inputs[0].shape,
                         loader_workers=args.loader_workers, on_corrupt=args.on_corrupt)
    if args.classes is not None and split.train.num_classes != args.classes:
        raise UsageError(f"--classes {args.classes} does not match dataset {args.dataset}, which "
                         f"has {split.train.num_classes} classes; leave --classes out")
    for part in (split.train, split.test):
        if part is not None and part.origin:
            print(f"data: {part.origin}", file=sys.stderr)
    graph = _build(args, in_shape=split.train.sample_shape, num_classes=split.train.num_classes)
    opt = SGD(lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
              nesterov=args.nesterov)
    from .planning import train_chunks
    chunks = train_chunks(args, graph, budget)
    try:
        ex = Executor(graph, args.batch, device=args.device, optimizer=opt, policy=args.policy,
                      seed=args.seed, budget=budget, offload_params=args.offload_params,
                      **resident_params_kw(args),
                      planner=planner_spec(args), grad_buckets=grad_buckets, grad_lag=lag,
                      chunks=chunks, replay=args.replay, precision=args.precision,
                      prefetch_ahead=args.prefetch_ahead, layout=args.layout,
                      **fuse_kw(args))
    except MemoryBudgetError as e:
        from ..plan import plan
        need = plan(graph, args.batch, policy=args.policy, offload_params=args.offload_params,
                    **resident_params_kw(args), trace=False, planner=planner_spec(args), chunks=chunks,
                    precision=args.precision, **fuse_kw(args))["min_budget_bytes"]
        hint = ""
        if args.policy != "superneurons" and not args.planner:   # the one that can evict
            least = plan(graph, args.batch, policy="superneurons", trace=False,
                         offload_params=args.offload_params, chunks=chunks,
                         precision=args.precision, **fuse_kw(args))["min_budget_bytes"]
            if least < need:
                hint = (f"; policy superneurons (the default under --budget) completes one in "
                        f"{fmt_bytes(least)}")
        raise MemoryBudgetError(f"{e}; the smallest budget in which policy {args.policy} "
                                f"completes an iteration is {need} bytes ({fmt_bytes(need)})"
                                + hint) from None
    meta = {"model": args.model, "depth": args.depth, "dataset": args.dataset}
    with stop_all_ranks_on_error(comm, "train"):
        dp = None
        if comm is not None:
            from ..distributed import DataParallel
            dp = DataParallel(ex, comm, sync_bn=args.sync_bn, check_every=args.dp_check_every)
        res = fit(ex, split.train, split.test, iters=args.iters, epochs=args.epochs, lr=args.lr,
                  schedule=args.schedule, warmup=args.warmup, seed=args.seed,
                  checkpoint=args.checkpoint, resume=args.resume, meta=meta,
                  progress=not args.no_progress, checkpoint_every=args.checkpoint_every, dp=dp)
    if dp is not None:
        from ..distributed.launch import comm_report
        stats, comm_line = comm_report(dp, res["seconds"])
        res.update(world_size=dp.world_size, global_batch=dp.global_batch, sync_bn=dp.sync_bn,
                   engine=comm.engine, bucket_mb=args.bucket_mb if dp.overlap else None, **stats)
        if dp.rank != 0:        # rank 0 reports for the job
            return 0
        print(comm_line)
    res.update(model=args.model, depth=args.depth, batch=args.batch, device=ex.device.name,
               policy=ex.policy.name, planner=args.planner, dataset=args.dataset,
               chunks=ex.chunks, replay=ex.replay["ran"], replay_detail=ex.replay,
               precision=ex.precision.name, layout=ex.layout)
    if ex.fuse:
        res.update(fuse=True, fused_layers=len(ex.fused), fused_counts=fused_counts(ex.graph))
    if ex.loss_scaler is not None:      # fp16
        res.update(loss_scale=ex.loss_scaler.scale, overflow_skipped_steps=ex.loss_scaler.skipped)
    res.update(ex.pool.counters())
    res["wall_seconds"] = round(time.perf_counter() - started, 3)
    line = (f"{args.model}: {res['iterations']} iterations, final loss {res['final_loss']:.4f}, "
            f"{res['images_per_sec']:.1f} img/s on {ex.device.name}, pool peak "
            f"{fmt_bytes(res['peak_bytes'])} (planned {fmt_bytes(res['planned_peak_bytes'] or 0)})"
            f", moved {fmt_bytes(res['offload_bytes'])} to host and "
            f"{fmt_bytes(res['prefetch_bytes'])} back" +
            (f" (planner {args.planner})" if args.planner else "") +
            (f", {ex.chunks} chunks per layer" if ex.chunks > 1 else "") +
            (f", {_fused_pairs_text(res['fused_counts'])}" if ex.fuse else "") +
            (f", precision {ex.precision}" if ex.precision.name != "fp32" else "") +
            (f", layout {ex.layout}" if ex.layout != "nchw" else "") +
            (f" (loss scale {ex.loss_scaler.scale:g}, {ex.loss_scaler.skipped} steps skipped for "
             "overflow)" if ex.loss_scaler is not None else "") +
            _replay_text(ex.replay))
    if "test_accuracy" in res:
        line += f", test accuracy {100 * res['test_accuracy']:.2f}%"
    line += f"; {res['wall_seconds']:.1f} s wall clock"
    if args.checkpoint:
        line += f"; state saved to {args.checkpoint}"
    print(line)
    if "loader" in res:
        ld = res["loader"]
        print(f"loader: {ld['images_decoded']} images decoded by {ld['workers']} threads, "
              f"training waited {res['data_wait_seconds']:.1f} s on it; "
              f"{ld['skipped_unreadable']} unreadable images skipped, "
              f"{ld['replaced_undecodable']} replaced")
    if args.json:
        print(json.dumps(res))
    return 0


COMMANDS.update(train=cmd_train, summary=cmd_summary, models=cmd_models, plan=cmd_plan,
                deepest=cmd_deepest, widest=cmd_widest, profile=cmd_profile)
COMMANDS.update(memory=cmd_memory)


if __name__ == "__main__":
    sys.exit(main())
