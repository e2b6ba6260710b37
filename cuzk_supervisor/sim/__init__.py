"""Simulators that stand in for the outside world with no GPU and no network, a package per
peer: :mod:`.daemon` (the cuzk proving daemon), :mod:`.manager` (the fleet manager),
:mod:`.machine` (GPUs, memory, cgroup, NVML). Shared by them: simulated time (:mod:`.clock`
scaled, :mod:`.vtime` virtual) and the fault switches' parsing (:mod:`.faults`). Beside them,
two stand-ins a test or demo starts on its own: the parameter download (:mod:`.fetch`) and
production-like demand on the daemon (:mod:`.demand`).
"""
