"""Generated scenes with ground truth and the task families asked about them, shared by `train` and `bench`."""
