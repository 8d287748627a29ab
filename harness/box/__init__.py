"""The box: what the machine is and does beside a measurement, the limits a run is held to
(cgroups, read-ahead, the CPU quota's calibration), one measurement at a time, cold starts, and
the machine's I/O and compute ceilings."""
