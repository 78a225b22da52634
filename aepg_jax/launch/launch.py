"""Several processes of `aepg_jax.main` on this machine, as one multi-host run on CPU.

    python -m aepg_jax.launch --num_processes=2 [--devices_per_process=1] -- \\
        --config=configs/default.py --workdir=runs/default

starts `python -m aepg_jax.main <the arguments after -->` N times with identical arguments; each
process gets its own CPU devices (`JAX_NUM_CPU_DEVICES`), its id (`AEPG_PROCESS_ID`, see
`aepg_jax/system/hosts.py`) and the coordinator address `127.0.0.1:<free port>`; JAX joins them over
gloo (CPU collectives). The launcher waits for all of them and exits with their status. If
one fails or dies, the others are stopped (SIGTERM, then SIGKILL after `--grace_s`) and the
launcher names it and exits with its status (128 + signal for a killed process). If the
launcher itself dies, its children kill themselves (`hosts.initialize`, Linux).

It simulates a multi-host job on one machine (tests, debugging); on real hosts start the same
command on every host with `--config.distributed=True` (see docs/devices.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import NoReturn

# The environment of a launched process, read by `aepg_jax.system.hosts` (this module imports
# no JAX).
ENV_NUM_PROCESSES = "AEPG_NUM_PROCESSES"
ENV_PROCESS_ID = "AEPG_PROCESS_ID"
ENV_LAUNCHER_PID = "AEPG_LAUNCHER_PID"
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
CPU_COLLECTIVES = "gloo"
EXIT_USER_ERROR = 2  # a user error, reported on one line (as `aepg_jax.system.cli`)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the coordinator binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(
    base: dict[str, str], num_processes: int, process_id: int, port: int, devices: int
) -> dict[str, str]:
    """The environment of process `process_id`: CPU devices, collectives and its place."""
    env = dict(base, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices))
    env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] = CPU_COLLECTIVES
    env[ENV_LAUNCHER_PID] = str(os.getpid())
    if num_processes > 1:
        env[ENV_COORDINATOR] = f"127.0.0.1:{port}"
        # Process 0's coordinator listens on loopback only (JAX's default: every interface).
        env["JAX_COORDINATOR_BIND_ADDRESS"] = f"127.0.0.1:{port}"
        env[ENV_NUM_PROCESSES] = str(num_processes)
        env[ENV_PROCESS_ID] = str(process_id)
    return env


def main_command(main_args: list[str]) -> list[str]:
    """`python -m aepg_jax.main main_args` with this interpreter."""
    return [sys.executable, "-m", "aepg_jax.main", *main_args]


def start(
    num_processes: int,
    devices: int,
    cmd: list[str],
    env: dict[str, str] | None = None,
    log_dir: str | None = None,
    **popen,
) -> list[subprocess.Popen]:
    """Starts N processes of `cmd` (e.g. `main_command(...)`), each in its place; with
    `log_dir`, process i's stdout and stderr go to `<log_dir>/process_<i>.log`."""
    port = free_port()
    base = dict(os.environ if env is None else env)
    if log_dir is not None:
        os.makedirs(log_dir, exist_ok=True)
    procs = []
    for i in range(num_processes):
        with contextlib.ExitStack() as files:  # the child keeps its own copy of the log file
            if log_dir is not None:
                log = files.enter_context(open(os.path.join(log_dir, f"process_{i}.log"), "ab"))
                popen.update(stdout=log, stderr=subprocess.STDOUT)
            env_i = process_env(base, num_processes, i, port, devices)
            procs.append(subprocess.Popen(cmd, env=env_i, **popen))
    return procs


def exit_status(returncode: int) -> int:
    """A child's return code as a shell exit status (128 + signal when killed)."""
    return 128 - returncode if returncode < 0 else returncode


def describe(
    process_id: int, num_processes: int, returncode: int, peak_rss: int | None = None
) -> str:
    """How process `process_id` ended; a SIGKILL nobody here sent is most likely the kernel's
    OOM killer, said with the process's peak RSS (bytes) when known."""
    if returncode < 0:
        how = f"was killed by {signal.Signals(-returncode).name}"
        if -returncode == signal.SIGKILL:
            how += ": most likely out of memory (the kernel's OOM killer)"
            if peak_rss:
                how += f", its peak RSS {peak_rss / 2**30:.1f} GiB"
    else:
        how = f"exited with status {returncode}"
    return f"process {process_id} of {num_processes} {how}"


def poll(p: subprocess.Popen) -> tuple[int | None, int | None]:
    """`(returncode or None, peak RSS in bytes)` of `p` without blocking: `os.wait4` reaps it
    with its resource usage (`Popen.poll` would drop that)."""
    if p.returncode is not None:
        return p.returncode, None
    try:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
    except ChildProcessError:
        return p.poll(), None
    if pid == 0:
        return None, None
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, usage.ru_maxrss * 1024  # Linux reports KiB


def stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to the running processes, SIGKILL to those still running after `grace_s`."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _wait_all(procs: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return


def supervise(
    procs: list[subprocess.Popen], grace_s: float, poll_s: float = 0.1, shown: bool = True
) -> int:
    """Waits for every process; at the first failure stops the others. The exit status.

    A process that exits with status 2 printed a user error (`aepg_jax.system.cli`); the others get
    `grace_s` to stop by themselves, as they do on a config error (printed by process 0 only).
    If they all did and their output is `shown` here (no log_dir), that line is the only one."""
    peaks: dict[int, int] = {}
    try:
        while True:
            codes = []
            for i, p in enumerate(procs):
                code, peak = poll(p)
                codes.append(code)
                if peak:
                    peaks[i] = peak
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i, code = failed[0]
                if code == EXIT_USER_ERROR:
                    _wait_all(procs, grace_s)
                    if shown and all(p.poll() == EXIT_USER_ERROR for p in procs):
                        return EXIT_USER_ERROR
                stop(procs, grace_s)
                print(
                    f"error: {describe(i, len(procs), code, peaks.get(i))}; stopped the other "
                    "processes.",
                    file=sys.stderr,
                    flush=True,
                )
                return exit_status(code)
            if all(c == 0 for c in codes):
                return 0
            time.sleep(poll_s)
    except KeyboardInterrupt:
        stop(procs, grace_s)
        return 128 + signal.SIGINT


def fail(message: str) -> NoReturn:
    """Ends the launcher with one `error:` line (exit 2), as `aepg_jax.system.cli.fail`."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        fail(f"{message}; aepg_jax.main's arguments go after -- (see --help).")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m aepg_jax.launch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="aepg_jax.main's own flags: python -m aepg_jax.main --helpfull.",
    )
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--devices_per_process", type=int, default=1)
    parser.add_argument(
        "--grace_s", type=float, default=10.0, help="SIGTERM to SIGKILL delay when stopping."
    )
    parser.add_argument(
        "--log_dir", help="write process i's output to LOG_DIR/process_<i>.log (default: here)"
    )
    return parser


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The launcher's options and the arguments for `aepg_jax.main` (after `--`)."""
    parser = _parser()
    if "--" not in argv:
        if "-h" in argv or "--help" in argv:
            parser.parse_args(["--help"])  # prints the help, exits 0
        fail(
            "put aepg_jax.main's arguments after --, e.g. python -m aepg_jax.launch "
            "--num_processes=2 -- --config=configs/default.py --workdir=runs/x"
        )
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    for name in ("num_processes", "devices_per_process"):
        if getattr(args, name) < 1:
            fail(f"--{name}={getattr(args, name)} must be at least 1.")
    if args.grace_s < 0:
        fail(f"--grace_s={args.grace_s} must be >= 0.")
    return args, argv[split + 1 :]


def main(argv: list[str]) -> int:
    args, main_args = parse(argv)
    procs = start(
        args.num_processes, args.devices_per_process, main_command(main_args), log_dir=args.log_dir
    )
    return supervise(procs, args.grace_s, shown=args.log_dir is None)
