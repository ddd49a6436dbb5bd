"""``securepad bench``: the benchmark suite, its saved results and the
instruction costs (the bench extra; its modules are imported when it runs)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

__all__ = ["bench"]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="Tiny sizes, every workload, about a minute (the CI smoke run).")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("securepad-bench-results"),
    show_default=True,
    help="Where to write <mode>.json (and <mode>.png with matplotlib).",
)
@click.option(
    "--workdir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where the stores go [default: a temporary dir].",
)
@click.option(
    "--backends",
    default=None,
    help="Comma-separated backends [default: all]: securepad, raw-apsw, unhardened, diskcache, sqlcipher;"
    " sealed-floor when named.",
)
@click.option(
    "--workloads",
    default=None,
    help="Comma-separated workloads [default: all]: put, read, concurrent, resume, gc, open, hotpath.",
)
@click.option("--no-progress", "progress", flag_value=False, default=True, help="No progress bar.")
@click.option("--no-chart", "chart", flag_value=False, default=True, help="Skip the PNG.")
@click.option("--tiny", is_flag=True, hidden=True)  # the smoke test's config
@click.option(
    "--from-json",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Print the summary of a saved run's JSON; run nothing.",
)
@click.option("--targets", "show_targets", is_flag=True, help="Also list the project's targets, each met or missed.")
@click.option("--tables", "show_tables", is_flag=True, help="Also print every workload's full table (Markdown).")
@click.option(
    "--costs",
    is_flag=True,
    help="Instead of the suite: instructions per operation (callgrind) for securepad, the sealed floor and"
    " raw apsw, with statements, WAL frames, key work and the targets; writes <out>/costs.json.",
)
@click.option(
    "--costs-method",
    type=click.Choice(["callgrind", "cpu"]),
    default=None,
    help="How --costs measures [default: callgrind when valgrind is installed, else CPU time].",
)
@click.option(
    "--costs-ops",
    default=None,
    help="Comma-separated operations --costs measures [default: all]: put, read, put_many, listing, anchor_sync.",
)
def bench(**options: Any) -> None:
    """Benchmark securepad against raw SQLite, sqlite3, diskcache and SQLCipher on this machine.

    Prints a summary in 80 columns: securepad beside each baseline, per
    workload, and where the results are (every figure and target is in the
    JSON). Needs the bench extra (pip install '.[bench]'); writes under --out."""
    from ..bench import runner

    saved, costs, method, ops = (options.pop(k) for k in ("from_json", "costs", "costs_method", "costs_ops"))
    if saved is not None:
        return runner.print_saved(saved, show_targets=options["show_targets"], show_tables=options["show_tables"])
    if costs or method is not None or ops is not None:
        try:
            chosen = runner.parse_names("operations", ops)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--costs-ops") from None
        from ..bench import instructions

        try:
            sys.exit(
                instructions.main(
                    out=options["out"], workdir=options["workdir"], method=method, tiny=options["tiny"], ops=chosen
                )
            )
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    try:
        backends, workloads = (runner.parse_names(field, options.pop(field)) for field in ("backends", "workloads"))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    sys.exit(runner.main(backends=backends, workloads=workloads, **options))
