"""How a benchmark row names its problem, for the table and the chart alike."""
from __future__ import annotations


def problem_label(r: dict) -> str:
    padding = "causal" if r.get("causal") else f"P{r['padding']}"
    s = f"{r['shape']} {r.get('dtype', 'fp32')}{' (B,L,C)' if r.get('layout') == 'blc' else ''} " \
        f"K{r['kernel_size']} {padding}"
    if r["stride"] != 1:
        s += f" S{r['stride']}"
    if r["dilation"] != 1:
        s += f" D{r['dilation']}"
    if r["bias"]:
        s += " bias"
    if r.get("activation") == "silu":
        s += " SiLU"
    if r.get("backward") or r.get("direction", "fwd") != "fwd":  # a training row says which direction it times
        s += f" {r['direction']}"
    if r.get("timing") == "graph":
        s += " (graph)"
    return s
