"""Whole stages of a study built on the box and the run: the I/O and compute ceilings, the stock
llama-bench baselines, and the CPU quota's calibration (each runs measurements of its own)."""
