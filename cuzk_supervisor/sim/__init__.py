"""Simulators that stand in for the outside world with no GPU and no network.

The simulated cuzk proving daemon (``python -m cuzk_supervisor.sim.daemon --config FILE --listen
ADDR``; contract in ``docs/simulator.md``) has the real daemon's gRPC service, flags, config
and quirks, with scaled time, scaled-but-real memory and switchable faults. Its pure parts
(``model``, ``pipeline``, ``faults``, ``config``) do no I/O.
"""
