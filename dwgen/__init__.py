"""dwgen: an autotuning code generator for depthwise 1D convolution on NVIDIA GPUs."""
