"""``python -m tests.cluster build|up|paths``: build the control-plane binaries, run the control plane.

    python -m tests.cluster build            # build what is missing (cached; prints a line per binary)
    python -m tests.cluster build --real-node  # also kubelet, kube-proxy, CoreDNS, pause (for scripts/e2e)
    python -m tests.cluster up               # the whole stack until Ctrl-C; prints export lines
    python -m tests.cluster up --no-kuberay --no-kwok
    python -m tests.cluster up --real-node   # plus one real node: pods really run (docs/cluster.md)
    python -m tests.cluster paths            # cache, bin dir and each binary's current build
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from tests.cluster import build


def _build(args: argparse.Namespace) -> int:
    names = args.names or None
    started = time.monotonic()
    try:
        timings = build.build_all(names, real_node=args.real_node)
    except build.GoToolchainMissing as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except build.BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if timings:
        for name, seconds in timings.items():
            print(f"{name:<26} {seconds:8.1f}s")
        print(f"{'total':<26} {time.monotonic() - started:8.1f}s")
    else:
        print("everything is already built")
    print(f"cache {build.cache_root()} ({build.cache_size_bytes() / 1024**2:.0f} MiB); binaries linked in {build.bin_dir()}")
    return 0


def _paths(args: argparse.Namespace) -> int:
    print(f"cache   {build.cache_root()}")
    print(f"bin     {build.bin_dir()}")
    absent = set(build.missing(real_node=True))
    for name in build.declared_names(real_node=True):
        if name in absent:
            print(f"{name:<26} (not built)")
        else:
            print(f"{name:<26} {build.binary_path(name, build=False)}")
    return 0


def _up(args: argparse.Namespace) -> int:
    from tests.cluster.manager import ControlPlane, ControlPlaneError, Options

    options = Options(controller_manager=not args.no_controller_manager, scheduler=not args.no_scheduler,
                      kwok=not args.no_kwok, kuberay=not args.no_kuberay, install_crds=not args.no_crds,
                      gpu_nodes=args.gpu_nodes, cpu_nodes=args.cpu_nodes, real_node=args.real_node)
    if options.kuberay and not options.controller_manager:
        print("note: KubeRay runs, but without the controller manager its submitter Jobs never get pods",
              file=sys.stderr)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda *_: stop.set())
    plane = ControlPlane(options)
    try:
        plane.start()
    except build.GoToolchainMissing as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (ControlPlaneError, build.BuildError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    plane.keep_workdir = args.keep
    if plane.project_crd_error:
        print(f"\nerror: {plane.project_crd_error}\n(the control plane keeps running without it)", file=sys.stderr)
    print("\nThe control plane is ready. In another shell:\n", flush=True)
    print(f"export KUBECONFIG={plane.kubeconfig}")
    print(f"export PATH={plane.bin_dir}:$PATH")
    print("kubectl get --raw /readyz\n", flush=True)
    print("Ctrl-C stops everything.", flush=True)
    exit_code = 0
    while not stop.wait(2.0):
        dead = plane.dead_components()
        if dead:
            for component in dead:
                print(f"error: {component.name} exited; log {component.log_path}:\n{component.log_tail()}",
                      file=sys.stderr)
            plane.keep_workdir = True
            exit_code = 1
            break
    print("stopping ...", file=sys.stderr, flush=True)
    plane.stop()
    return exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="build the missing control-plane binaries")
    build_parser.add_argument("names", nargs="*", help="only these (default: everything declared)")
    build_parser.add_argument("--real-node", action="store_true",
                              help="also the real node's parts (kubelet, kube-proxy, CoreDNS, pause; for scripts/e2e)")
    build_parser.set_defaults(func=_build)
    paths_parser = commands.add_parser("paths", help="show the cache, bin dir and current builds")
    paths_parser.set_defaults(func=_paths)
    up_parser = commands.add_parser("up", help="run the control plane until Ctrl-C")
    up_parser.add_argument("--no-controller-manager", action="store_true")
    up_parser.add_argument("--no-scheduler", action="store_true")
    up_parser.add_argument("--no-kwok", action="store_true", help="no fake nodes (pods stay Pending)")
    up_parser.add_argument("--no-kuberay", action="store_true")
    up_parser.add_argument("--no-crds", action="store_true", help="install neither our CRD nor KubeRay's")
    up_parser.add_argument("--gpu-nodes", type=int, default=2, help="fake H200 nodes with 8 GPUs each")
    up_parser.add_argument("--cpu-nodes", type=int, default=1, help="fake CPU-only nodes")
    up_parser.add_argument("--keep", action="store_true", help="keep the folder (logs, kubeconfig) after stopping")
    up_parser.add_argument("--real-node", action="store_true",
                           help="add one real node (kubelet, containerd, CoreDNS, kube-proxy) in namespaces of the "
                                "cluster's own; needs `build --real-node` and Debian's containerd, runc, CNI plugins")
    up_parser.set_defaults(func=_up)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
