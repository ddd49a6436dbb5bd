"""What each run does: sizes, repetitions and time budgets, as data."""

from __future__ import annotations

from dataclasses import dataclass, replace

KiB = 1024
MiB = 1024 * KiB


def size_label(size: int) -> str:
    """1024 -> '1 KiB', 104857600 -> '100 MiB'."""
    if size >= MiB and size % MiB == 0:
        return f"{size // MiB} MiB"
    if size >= KiB and size % KiB == 0:
        return f"{size // KiB} KiB"
    return f"{size} B"


@dataclass(frozen=True)
class Config:
    """One run's workload sizes and budgets: the published run (about ten minutes on
    two cores) unless ``quick()`` or ``tiny()`` makes it smaller."""

    mode: str = "full"
    # put: one entry per operation, sequential, one process
    put_sizes: tuple[int, ...] = (1 * KiB, 4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB)
    put_budget_s: float = 3.0  # per backend and size; stops early at put_max_ops
    put_max_ops: int = 2000
    put_min_ops: int = 10
    # head/tail/range of read_chars characters, measured in a fresh process per backend and size;
    # 64 KiB is the reference for the "tail of 100 MiB within 3x of 64 KiB" target.
    read_sizes: tuple[int, ...] = (4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 100 * MiB)
    read_budget_s: float = 1.5  # per backend, size and mode
    read_max_ops: int = 500
    read_min_ops: int = 5
    # concurrent mixed put/read, 50/50, of concurrent_bytes entries: (processes, threads)
    concurrency: tuple[tuple[int, int], ...] = ((1, 1), (1, 4), (2, 1), (2, 4), (4, 2), (8, 1))
    concurrency_seconds: float = 5.0
    # turn resumption in a fresh process; resume_processes fresh processes per backend and size
    resume_steps: tuple[int, ...] = (10, 100, 1000)
    resume_processes: int = 8
    # gc of gc_entries expired entries of gc_entry_bytes each
    gc_entries: int = 100_000
    # open() of an existing store, open_reps times per key source
    open_reps: int = 10
    read_chars: int = 2000
    # the machine's CPU scaling: how long each spinning process of the probe runs
    scaling_seconds: float = 0.5
    concurrent_bytes: int = 4 * KiB
    resume_entry_bytes: int = 8 * KiB
    gc_entry_bytes: int = 1 * KiB
    seed: int = 20240611

    def quick(self) -> Config:
        """The CI smoke run: every workload, tiny sizes, well under a minute. Its timings mean little."""
        return replace(
            self,
            mode="quick",
            put_sizes=(1 * KiB, 4 * KiB, 64 * KiB, 1 * MiB),
            put_budget_s=0.15,
            put_max_ops=100,
            put_min_ops=3,
            read_sizes=(4 * KiB, 64 * KiB, 1 * MiB),
            read_budget_s=0.05,
            read_max_ops=50,
            read_min_ops=3,
            concurrency=((1, 1), (2, 4)),
            concurrency_seconds=0.5,
            resume_steps=(10, 100),
            resume_processes=1,
            gc_entries=1000,
            open_reps=2,
        )

    def tiny(self) -> Config:
        """Smaller still than ``quick()``: for the smoke test, which checks structure only.
        Each read size and each concurrency case is a fresh process per backend."""
        return replace(
            self.quick(),
            put_sizes=(1 * KiB, 4 * KiB, 64 * KiB),
            put_budget_s=0.05,
            read_sizes=(64 * KiB,),
            concurrency=((2, 2),),
            concurrency_seconds=0.3,
            resume_steps=(10,),
            gc_entries=200,
            open_reps=1,
            scaling_seconds=0.05,
        )
