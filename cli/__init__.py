"""The `shmcache` command: one dispatcher over the commands of this package.

Each command is a module here with HELP, `add_arguments(parser)` and `run(args)`
(the command's body, returning its exit code); COMMANDS lists them in the order
`shmcache --help` shows them. Adding a command: a module and one line below.
Argument helpers shared by the commands live in cli/args.py. Nothing below the
command line imports this package.

Errors: a user's mistake is one line on stderr and exit 2, never a traceback;
ShmcacheError, ValueError and OSError from a command are shown that way too. The
commands every reader gives (get, watch, stats, status, wait-ready: docs/reader-contract.md)
word it `shmcache: KIND: message`, KIND naming the case as the Go and Java readers do.

Signals: SIGTERM and SIGHUP (a closing terminal: an ssh or tmux session that ends) stop a
command as Ctrl-C does, by a KeyboardInterrupt, so what it made is removed on the way out
(a half-restored cache, a snapshot's temporary file, the demo's cache, topic and
processes); killed by their default action it was left. One line, exit 128 + the signal.
A signal ignored when the command started (nohup) stays ignored. `run` has its own.
A stdout closed by its reader (`| head -c 1`) ends a command quietly, exit 128 + SIGPIPE.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys

import shmcache
from shmcache.cli import stop
from shmcache.cli.args import CONTRACT, ArgParser, one_line
from shmcache.errors import error_kind

COMMANDS = (  # (command, module in shmcache.cli)
    ("create", "create"),
    ("stats", "stats"),
    ("get", "get_key"),
    ("set", "set_key"),
    ("delete", "delete_key"),
    ("destroy", "destroy"),
    ("list", "list_caches"),
    ("run", "run"),
    ("status", "status"),
    ("wait-ready", "wait_ready"),
    ("watch", "watch"),
    ("snapshot", "snapshot"),
    ("restore", "restore"),
    ("demo", "demo"),
    ("produce", "produce"),
    ("top", "top"),
    ("spark", "spark"),
    ("warm", "warm"),
    ("size", "size"),
    ("resize", "resize"),
)


def parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser. For a line that names its command first (`shmcache
    wait-ready ...`), only that command's module is imported and its arguments known: the
    others are names only, and a line is judged, and refused, without importing what
    the other commands need (the table's kernels, Kafka, Spark). Otherwise (`shmcache
    --help`, no command) every command's."""
    chosen = argv[0] if argv and argv[0] in dict(COMMANDS) else None
    p = ArgParser(prog="shmcache", description="A cache in POSIX shared memory, kept filled from Kafka.")
    sub = p.add_subparsers(dest="command", required=True)
    for command, module in COMMANDS:
        if chosen is not None and command != chosen:
            sub.add_parser(command)  # a name only: the line names another command
            continue
        mod = importlib.import_module(f"shmcache.cli.{module}")
        sp = sub.add_parser(command, help=mod.HELP)
        mod.add_arguments(sp)
        sp.set_defaults(fn=mod.run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # a run's workers' fork server imports while this process does (consumer/worker/forkserver.py)
    if args[:1] == ["run"] and not {"-h", "--help"} & set(args):
        from shmcache.consumer.worker import forkserver

        forkserver.prestart()
    a = parser(args).parse_args(args)
    if a.command != "run":  # run has its own
        stop.install(signal.SIGTERM, signal.SIGHUP)
    try:
        code = a.fn(a)
        stop.STOP.check()  # a stop whose KeyboardInterrupt a finalizer dropped: the command still says so
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except (shmcache.ShmcacheError, ValueError, OSError) as e:
        kind = f"{error_kind(e)}: " if a.command in CONTRACT else ""  # docs/reader-contract.md
        print(f"shmcache: {kind}{one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        signum = stop.STOP.signum or signal.SIGINT
        with contextlib.suppress(OSError):  # a terminal that closed takes no more lines
            print(f"shmcache: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum
    except SystemExit as e:
        if isinstance(e.code, str):  # a command's own usage error: its message, and the usage-error code
            print(e.code, file=sys.stderr)
            return 2
        raise


def _closed_pipe() -> int:
    """The reader of stdout went away (`| head`): a quiet exit, as a command killed by SIGPIPE
    would have made, 128 + SIGPIPE. stdout is pointed at /dev/null first, so that the
    interpreter's last flush of what is still buffered finds no closed pipe either."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE
