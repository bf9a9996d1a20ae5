"""A comm region that records how long each collective blocked, registered as the balancing runtime
registers its meter's (:func:`semimig.comm.primitives.time_collectives`), for tests that read what a
rank's step clock would count as communication."""
import contextlib
import time


@contextlib.contextmanager
def recorded_comm():
    """Inside the block, every collective semimig times runs in a region whose seconds are appended to
    the yielded list."""
    from semimig.comm import primitives as P

    inside = []

    @contextlib.contextmanager
    def comm():
        start = time.perf_counter()
        yield
        inside.append(time.perf_counter() - start)

    class Meter:  # a bound method, as the balancing runtime registers its meter's
        def region(self):
            return comm()

    meter = Meter()
    untime = P.time_collectives(meter.region)
    try:
        yield inside
    finally:
        untime()
