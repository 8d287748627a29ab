"""The box: what the machine is and does beside a measurement, the limits a run is held to
(cgroups, read-ahead), the counters a token's time is read from, one measurement at a time, and
cold starts. The stages that measure the box (ceilings, calibration) are harness.stages."""
