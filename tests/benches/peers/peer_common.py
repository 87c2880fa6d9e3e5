"""Shared measuring of the Python peer benchmarks (driven by `cargo bench --bench peers`).

Both peers run on aio-pika, so one patch of `aio_pika.IncomingMessage.ack` sees every ack
they write. The window runs from the handler's first call to the N-th ack written, the
same end point as the Rust benches. Within it: the process CPU (getrusage, all threads),
the broker's CPU (/proc/<beam pid>/stat, when RABBITKIT_BENCH_BROKER_PID is set) and the
peak resident set (reset at the start of the window where the kernel allows it).

The result is one line on stdout: `PEER_RESULT {json}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import sys
import time
from urllib.parse import unquote, urlparse

import aio_pika.message

TICKS = os.sysconf("SC_CLK_TCK")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["declare", "run"])
    p.add_argument("--url", required=True)
    p.add_argument("--queue", required=True, help="work queue")
    p.add_argument("--path", choices=["success", "failure"], required=True)
    p.add_argument("-n", type=int, default=0)
    p.add_argument("--prefetch", type=int, default=200)
    p.add_argument("--timeout", type=float, default=600.0)
    return p.parse_args()


def url_parts(url: str) -> dict:
    u = urlparse(url)
    vhost = unquote(u.path[1:]) if u.path and u.path != "/" else "/"
    return {
        "host": u.hostname or "localhost",
        "port": u.port or 5672,
        "username": unquote(u.username or "guest"),
        "password": unquote(u.password or "guest"),
        "vhost": vhost or "/",
    }


def quiet() -> None:
    """No per-message logging (the Rust side logs nothing without a subscriber either)."""
    logging.disable(logging.CRITICAL)
    try:  # rabbitkit logs through structlog, which prints unless filtered
        import structlog

        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    except ImportError:
        pass


def _broker_cpu() -> float:
    pid = os.environ.get("RABBITKIT_BENCH_BROKER_PID", "")
    if not pid.isdigit():
        return float("nan")
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / TICKS
    except (OSError, IndexError, ValueError):
        return float("nan")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _hwm_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


class Meter:
    """Counts acks written; marks the window."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.acked = 0
        self.start: tuple[float, float, float] | None = None
        self.end: tuple[float, float, float] | None = None
        self.done = asyncio.Event()
        meter = self
        original = aio_pika.message.IncomingMessage.ack

        async def counted_ack(msg, multiple: bool = False) -> None:
            await original(msg, multiple=multiple)
            meter.acked += 1
            if meter.acked == meter.n:
                meter.end = meter._mark()
                meter.done.set()

        aio_pika.message.IncomingMessage.ack = counted_ack

    @staticmethod
    def _mark() -> tuple[float, float, float]:
        return (time.perf_counter(), _cpu(), _broker_cpu())

    def first(self) -> None:
        """Called by the handler: the first call opens the window."""
        if self.start is None:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                pass
            self.start = self._mark()

    async def wait(self, timeout: float) -> None:
        await asyncio.wait_for(self.done.wait(), timeout)

    def result(self) -> dict:
        assert self.start is not None and self.end is not None
        per_10k = 10_000 / self.n
        return {
            "n": self.n,
            "rate": self.n / (self.end[0] - self.start[0]),
            "cpu_per_10k": (self.end[1] - self.start[1]) * per_10k,
            "broker_cpu_per_10k": (self.end[2] - self.start[2]) * per_10k,
            "peak_mib": _hwm_mib(),
        }


def emit(tag: str, obj: dict) -> None:
    # JSON has no NaN: an unknown figure is null.
    obj = {k: (None if isinstance(v, float) and v != v else v) for k, v in obj.items()}
    sys.stdout.write(f"{tag} {json.dumps(obj)}\n")
    sys.stdout.flush()
