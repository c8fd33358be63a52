"""Benchmark modules, one per op family, run by `ejkernel bench <family>`; each writes JSON and a PNG plot."""
