"""Kernel families: one module per kind of kernel (direction, layout), each its axes, restrictions and geometry."""
