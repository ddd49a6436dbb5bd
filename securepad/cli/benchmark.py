"""``securepad bench``: the benchmark suite, its saved results and the
instruction costs (the bench extra; its modules are imported when it runs)."""

from __future__ import annotations

import sys
from pathlib import Path

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
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--no-chart", is_flag=True, help="Skip the PNG.")
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
def bench(
    quick: bool,
    out: Path,
    workdir: Path | None,
    backends: str | None,
    workloads: str | None,
    no_progress: bool,
    no_chart: bool,
    tiny: bool,
    from_json: Path | None,
    show_targets: bool,
    show_tables: bool,
    costs: bool,
    costs_method: str | None,
    costs_ops: str | None,
) -> None:
    """Benchmark securepad against raw SQLite, sqlite3, diskcache and SQLCipher on this machine.

    Prints a summary in 80 columns: securepad beside each baseline, per
    workload, and where the results are (every figure and target is in the
    JSON). Needs the bench extra (pip install '.[bench]'); writes under --out."""
    from ..bench import runner
    from ..bench.backends import BACKENDS
    from ..bench.workloads import WORKLOADS

    if from_json is not None:
        runner.print_saved(from_json, show_targets=show_targets, show_tables=show_tables)
        return
    if costs or costs_method is not None or costs_ops is not None:
        try:
            ops = runner.parse_names("operations", costs_ops) if costs_ops else None
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--costs-ops") from None
        from ..bench import instructions

        try:
            sys.exit(instructions.main(out=out, workdir=workdir, method=costs_method, tiny=tiny, ops=ops))
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    try:
        chosen_backends = runner.parse_names("backends", backends) if backends else list(BACKENDS)
        chosen_workloads = runner.parse_names("workloads", workloads) if workloads else list(WORKLOADS)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    status = runner.main(
        out=out,
        quick=quick,
        tiny=tiny,
        workdir=workdir,
        backends=chosen_backends,
        workloads=chosen_workloads,
        progress=not no_progress,
        chart=not no_chart,
        show_targets=show_targets,
        show_tables=show_tables,
    )
    sys.exit(status)
