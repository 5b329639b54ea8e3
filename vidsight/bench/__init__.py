"""Generated videos with ground truth, task families and accuracy benchmarks."""
