"""`callgate run` put together: the worker, its health server, its signals, its exit status."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time

from prometheus_client import CollectorRegistry

from worker.compose import build_key_store, build_metrics, build_processor, build_tracing
from worker.errors import InfrastructureError
from worker.health import HealthServer
from worker.runtime import broker_log
from worker.runtime.worker import Worker
from worker.settings import Settings

log = logging.getLogger("callgate.worker")

#: Young collections: one per this many tracked objects allocated and still alive per record a
#: fetch may bring (a round's records, their headers, emissions and outbox records live till the
#: round ends).
YOUNG_OBJECTS_PER_FETCHED_RECORD = 10


async def run_until_stopped(worker: Worker, *, handle_signals: bool = True) -> None:
    """Start, run until SIGTERM/SIGINT (or `request_stop()`), then drain and close."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
    for number in signals:
        loop.add_signal_handler(number, worker.request_stop)
    try:
        await worker.start()
        try:
            await worker.run()
        finally:
            await worker.close()
    finally:
        for number in signals:
            loop.remove_signal_handler(number)


def settle_heap(fetch_max_records: int) -> None:
    """Tune the cyclic collector for a worker whose startup heap is built.

    Everything built so far (modules, compiled contracts, metrics) lives as long as the process.
    Frozen, it is left out of the collector's full passes: on a loaded worker those came every
    second or two, took 30-130 ms each with the round waiting, and freed nothing.

    A young collection runs once the tracked objects allocated and still alive pass a threshold,
    700 by default; a round's objects are freed by reference counting when it ends, so those
    collections free almost nothing. Measured on a worker draining 200,000 records in rounds of
    2,000: at 700, about 470 young, 43 middle and 2 full collections, 0.10-0.19 s in all (6-10 %
    of the drain); at 20,000, about 100 young and 10 middle ones, 0.03-0.04 s.
    """
    gc.freeze()
    _, middle, old = gc.get_threshold()
    young = max(700, YOUNG_OBJECTS_PER_FETCHED_RECORD * fetch_max_records)
    gc.set_threshold(young, middle, old)


def serve(settings: Settings, *, settings_ms: float = 0.0) -> int:
    """`callgate run`: build everything from the settings, serve until stopped; the exit status.

    Raises `ConfigError` or `SchemaLoadError` before anything connects when a setting or a
    contract is wrong (the command line turns them into one message and status 2, so nothing is
    logged before). The first line says what loading the settings took (`settings_ms`, measured
    by the caller), compiling the contracts and starting the rest: `benchmarks/startup.py`
    splits a start on it.
    """
    started = time.perf_counter()
    processor = build_processor(settings, candidate=settings.shadow.schemas)
    compiled = time.perf_counter()
    metrics = build_metrics(settings, processor)
    tracing = build_tracing(settings)
    worker = Worker(
        settings, processor, lambda: build_key_store(settings), metrics, tracing=tracing
    )
    # always served: the probes need /healthz and /readyz even with metrics off (empty /metrics)
    exposed = metrics.registry if settings.metrics.enabled else CollectorRegistry()
    health = HealthServer(exposed, worker.readiness)
    port = health.start(settings.metrics.host, settings.metrics.port)
    repeats = broker_log.install(worker.broker, metrics, time.monotonic)
    log.info(
        "health and metrics on http://%s:%d/ (settings loaded in %.1f ms, contracts compiled "
        "in %.1f ms, the rest built in %.1f ms)",
        settings.metrics.host,
        port,
        settings_ms,
        (compiled - started) * 1000,
        (time.perf_counter() - compiled) * 1000,
    )
    settle_heap(settings.kafka.fetch_max_records)
    try:
        asyncio.run(run_until_stopped(worker))
    except InfrastructureError as exc:
        if exc is not worker.fatal:  # the worker said its own when it stopped for it
            log.error("%s", exc)
        return 1
    finally:
        health.stop()
        broker_log.uninstall(repeats)
        if tracing is not None:
            tracing.shutdown()
    return 0
