"""``PLEEmbedding.host_thread_time``: CPU time of a path's own host threads,
counted once per thread however the blocks nest."""

import threading
import time

from ple_bench.backends.device import DeviceResidentEmbedding


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_nested_blocks_count_once_and_threads_add_up():
    b = DeviceResidentEmbedding(64, 4, dtype="fp32", device="cpu")
    assert b.host_thread_s == 0.0
    with b.host_thread_time():
        _spin(0.02)
        with b.host_thread_time():  # nested: already counted by the outer block
            _spin(0.02)
    one = b.host_thread_s
    assert 0.035 <= one < 0.2

    def work():
        with b.host_thread_time():
            _spin(0.02)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 0.035 <= b.host_thread_s - one < 0.3  # two threads, ~20 ms of CPU each


def test_sleeping_is_not_cpu_time():
    b = DeviceResidentEmbedding(64, 4, dtype="fp32", device="cpu")
    with b.host_thread_time():
        time.sleep(0.05)
    assert b.host_thread_s < 0.02


def test_a_host_sync_lookup_record_keeps_its_event_samples():
    """The schema's ``event_samples_ms`` (the CUDA events' time of the host-sync calls) reaches
    the record; the other timers have none."""
    from ple_bench.measure.fields import measurement_fields
    from ple_bench.measure.timer import Measurement

    synced = Measurement([0.05, 0.06, 0.055], "host_sync", [None] * 3, [False] * 3, "max_samples", 3,
                         event_samples_ms=[0.02, 0.021, 0.019])
    assert measurement_fields(synced)["event_samples_ms"] == [0.02, 0.021, 0.019]
    plain = Measurement([0.05, 0.06, 0.055], "cuda_event", [None] * 3, [False] * 3, "max_samples", 3)
    assert measurement_fields(plain)["event_samples_ms"] is None
