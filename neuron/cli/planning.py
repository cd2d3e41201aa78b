"""CLI pieces for time and planners: `neuron profile`, `plan --time`, `--planner NAME`.

Kept apart from cli.py so that the commands there only gain a line or two each.
"""
from __future__ import annotations

import json


#: the commands whose budgeted runs of the superneurons policy get its planner by default
#: (deepest and widest plan at every probe of their search: they keep the policy)
PLANNED_BY_DEFAULT = ("plan", "train", "memory")


def add_planner_arg(p, default_under_budget: bool = False) -> None:
    from .args import count, numeric, positive_number
    from ..memory.planners import planner_names
    default = ("default: superneurons under --budget with --policy superneurons, else the "
               "policy alone" if default_under_budget else "default: the policy alone")
    p.add_argument("--planner", default=None, metavar="NAME",
                   help="memory planner (neuron/memory/planners): "
                   f"{', '.join(planner_names())}; overrides --policy; 'none': the policy "
                   f"alone ({default})")
    # options of the search planners (issue 13); train already has its own --seed
    if "--seed" not in p._option_string_actions:
        p.add_argument("--seed", type=count("--seed"), default=0, help="random seed of a search planner")
    p.add_argument("--compress", type=numeric("--compress", int), choices=[2, 4], default=None,
                   help="FreeLunch: feature maps go to the host compressed, 2 (bf16) or 4 "
                   "(8-bit block floating point); lossy, off by default; without --planner "
                   "it applies to superneurons; with --planner home the swarm decides per "
                   "tensor whether to compress")
    p.add_argument("--search-seconds", type=positive_number("--search-seconds"), default=None, metavar="T",
                   help="home: stop the swarm search after T CPU seconds (default 30); dqn: "
                   "stop the noisy rollouts after T CPU seconds (default 10)")
    p.add_argument("--agent", default=None, metavar="FILE.npz",
                   help="dqn: the trained agent to plan with (default: the agent bundled with "
                   "neuron, trained by bench/dqn.py)")


def resolve_planner(args, command: str) -> None:
    """Fill in train's --policy default and --planner's (PLANNED_BY_DEFAULT): under a budget
    the superneurons planner chooses, by simulated time, among the policy's own plan and its
    cost-based variants. The policy alone thrashes where memory is tight: ResNet-50 batch 32
    at 0.3x the liveness peak simulates 81.0 ms against the planner's 28.7 (H100 analytic),
    and at batch 284 in 12 GiB its LRU moved 7 GB each way per iteration on the H100 (+68%
    over no budget).

    train's policy is liveness without a budget (nothing moved or recomputed: the fastest
    where memory is no object) and superneurons under one, so that training in a budget works
    without knowing the policies: liveness alone cannot evict, and `train resnet_cifar --depth
    20 --budget 20MiB` failed needing 51 MiB where the planner fits 8.1 MiB. Where liveness
    fits, the planner keeps its plan (its "liveness" variant: the same steps and results)."""
    if command == "train" and getattr(args, "policy", "") is None:
        args.policy = "superneurons" if getattr(args, "budget", None) else "liveness"
    if not hasattr(args, "planner"):
        return
    if args.planner == "none":
        if getattr(args, "compress", None):
            from ..errors import UsageError
            raise UsageError("--compress plans with a planner (superneurons unless --planner "
                             "names another); leave out --planner none")
        args.planner = None
    elif args.planner is None and command in PLANNED_BY_DEFAULT and \
            getattr(args, "budget", None) and getattr(args, "policy", None) == "superneurons":
        args.planner = "superneurons"


def planner_spec(args) -> str | None:
    """--planner with its options as get_planner reads them ("home:seed=3,...")."""
    name = getattr(args, "planner", None)
    rate = getattr(args, "compress", None)
    if not name and not rate:
        return None
    name = name or "superneurons"
    opts = {}
    if name == "home":
        opts["seed"] = args.seed
        if args.search_seconds is not None:
            opts["search_seconds"] = args.search_seconds
    if name == "dqn":
        opts["seed"] = args.seed
        if args.search_seconds is not None:
            opts["search_seconds"] = args.search_seconds
        if getattr(args, "agent", None):
            if "," in args.agent or "=" in args.agent:   # the "name:key=value,..." spec
                raise ValueError(f"--agent {args.agent}: the path may not contain ',' or '='; "
                                 "rename or link the file")
            opts["agent"] = args.agent
    if rate:
        opts["compress"] = rate
    return name + ":" + ",".join(f"{k}={v}" for k, v in opts.items()) if opts else name


def train_chunks(args, graph, budget) -> int:
    """`train --chunks N|auto`: the chunk count (memory/chunking.py); auto: the smallest that
    fits --budget with the policy or --planner (1 where none does: the budget error follows)."""
    if args.chunks != "auto":
        return args.chunks
    from ..errors import UsageError
    if budget is None:
        raise UsageError("--chunks auto needs --budget: it picks the fewest chunks that fit it")
    from ..plan import choose_chunks
    return choose_chunks(graph, args.batch, budget, policy=args.policy,
                         offload_params=args.offload_params, planner=planner_spec(args)) or 1


def add_time_args(p) -> None:
    p.add_argument("--time", action="store_true",
                   help="also simulate the iteration's time on two streams (compute, copy; with "
                   "--data-parallel K a third for the all-reduces)")
    p.add_argument("--profile", default=None, metavar="FILE.json",
                   help="measured per-layer times from `neuron profile` (default: analytic "
                   "estimate from FLOPs and bytes)")
    p.add_argument("--cost-device", default="h100", choices=["cpu", "h100", "h200"],
                   help="device of the analytic cost model (default h100)")


def add_profile_command(sub, positive) -> None:
    """``neuron profile``; ``positive(name)`` is the CLI's positive-integer converter (cli.py's,
    passed down so that this module never imports the CLI above it)."""
    pr = sub.add_parser("profile", help="time each layer's kernels once, for plan --time",
                        description="Run MODEL's training steps on a device, time every kernel "
                        "and save the times keyed by layer geometry, dtype and device.")
    pr.add_argument("model", help="model name (see `neuron models`)")
    pr.add_argument("--depth", type=positive("--depth"), default=None,
                    help="depth, for the models that take one (default: the model's own)")
    pr.add_argument("--batch", type=positive("--batch"), default=32, help="batch size")
    pr.add_argument("--image-size", type=positive("--image-size"), default=None,
                    help="input height and width (default: the model's)")
    pr.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="device whose kernels are timed")
    from .args import fuse_option, layout_option, precision_option
    precision_option(pr)
    layout_option(pr)
    fuse_option(pr)
    pr.add_argument("--repeat", type=positive("--repeat"), default=3,
                    help="timed iterations")
    pr.add_argument("-o", "--output", required=True, metavar="FILE.json",
                    help="where the profile is written (JSON)")


def cost_model(args, dtype=None):
    """The cost model a command asked for, or None without --time/--planner."""
    import numpy as np
    from ..memory.costmodel import CostModel
    dtype = dtype or np.float32
    if getattr(args, "profile", None):
        return CostModel.from_profile(args.profile, dtype=dtype)
    return CostModel.analytic(getattr(args, "cost_device", None) or "h100", dtype=dtype)


def cmd_profile(args) -> int:
    from ..memory.profile import profile_model
    from ..models import build_model
    in_shape = None
    if args.image_size:
        g = build_model(args.model, depth=args.depth)
        in_shape = (g.inputs[0].shape[0], args.image_size, args.image_size)
    graph = build_model(args.model, depth=args.depth, in_shape=in_shape)
    if args.fuse:                   # BNReLU, AddReLU layers timed under their own keys
        from ..fuse import fuse_graph
        graph = fuse_graph(graph)
    prof = profile_model(graph, args.batch, device=args.device, repeat=args.repeat,
                         model=args.model, precision=args.precision, layout=args.layout)
    with open(args.output, "w") as f:
        json.dump(prof, f, indent=1)
    print(f"{args.model} batch {args.batch} on {prof['device']} ({prof['device_detail']}): "
          f"{len(prof['entries'])} layer geometries, iteration "
          f"{prof['measured_iteration_s']:.3f} s, written to {args.output}")
    return 0


def print_time(r: dict) -> None:
    if r.get("simulated_time_s") is None:
        return
    hid = r.get("copy_hidden_fraction")
    print(f"  simulated iteration     {r['simulated_time_s'] * 1e3:.3f} ms on "
          f"{r['cost_device']} ({r['cost_source']}); unlimited memory "
          f"{r['unlimited_time_s'] * 1e3:.3f} ms; overhead {r['overhead_pct']:.1f}%")
    print(f"  copies                  {r['bytes_moved'] / 2**20:.1f} MiB moved, "
          f"{r['copy_s'] * 1e3:.3f} ms on the copy stream, "
          f"{'-' if hid is None else f'{100 * hid:.0f}%'} hidden under compute; "
          f"recompute {r['recompute_s'] * 1e3:.3f} ms")
    if r.get("codec_s"):                # --compress: the FreeLunch codec's own stream
        print(f"  codec                   {r['codec_s'] * 1e3:.3f} ms on its own stream "
              "(its staging blocks are in the arena and the peak)")
    if r.get("allreduce_exposed_s") is not None and r["allreduce_time_s"] > 0:    # K > 1
        ar, ex = r["allreduce_time_s"], r["allreduce_exposed_s"]
        print(f"  all-reduce on the clock {ar * 1e3:.3f} ms on the comm stream, "
              f"{ex * 1e3:.3f} ms exposed ({'-' if ar <= 0 else f'{100 * (1 - ex / ar):.0f}%'}"
              " hidden under backward; included in the simulated iteration)")
